#!/usr/bin/env bash
# The real-text corpus of the percolator benchmark (bench/apt_corpus.py, issue 17): Debian
# package descriptions from apt's lists. `apt-cache dumpavail` has only the short descriptions;
# the long ones are in the Translation-en lists, which Debian container images skip
# (Acquire::Languages "none"). This fetches the package lists and Translation-en (needs root or
# sudo, and network). Tests do not need it (tests/percolator/data/apt_sample.txt.gz).
set -euo pipefail
have() { ls /var/lib/apt/lists/*_i18n_Translation-en* >/dev/null 2>&1 \
  && [ "$(apt-cache dumpavail 2>/dev/null | grep -c '^Package:')" -gt 1000 ]; }
if have; then
  echo "apt lists with Translation-en present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q -o 'Acquire::Languages::=en' -o 'Acquire::Languages=en'
have || { echo "apt-get update did not bring Translation-en" >&2; exit 1; }
echo "apt lists: $(apt-cache dumpavail | grep -c '^Package:') stanzas, with Translation-en"
