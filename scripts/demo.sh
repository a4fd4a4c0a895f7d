#!/usr/bin/env bash
# Install everything and run the demo: a server on the embedded defaults and three tenants' agent jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fairgate demo "$@"
