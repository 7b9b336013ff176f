# The job image for docker-compose.yml: Python 3.11 + JDK 17 + this package (with its native core,
# built from core/ by maturin, so the image needs a Rust toolchain) + the Kafka connector jars.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless maven curl ca-certificates build-essential \
    && rm -rf /var/lib/apt/lists/*
# Debian's rustc is older than the crate's dependencies need: the stable toolchain via rustup.
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /app
COPY . /app
RUN python -m venv .venv && .venv/bin/pip install --no-cache-dir -e . && bash scripts/fetch-jars.sh
ENV PATH=/app/.venv/bin:$PATH
CMD ["cep", "--help"]
