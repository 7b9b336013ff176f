# The job image for docker-compose.yml: Python 3.11 + JDK 17 + this package + the Kafka connector jars.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
RUN python -m venv .venv && .venv/bin/pip install --no-cache-dir -e . && bash scripts/fetch-jars.sh
ENV PATH=/app/.venv/bin:$PATH
CMD ["cep", "--help"]
