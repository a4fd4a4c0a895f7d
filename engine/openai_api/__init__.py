"""fairgate's engine behind vLLM's OpenAI-compatible HTTP API (`fairgate engine serve`).

`engine/__init__.py` does not import this package: `import engine` stays free of the HTTP stack.
"""

from engine.openai_api.app import build_app
from engine.openai_api.server import listening_socket, running_server, serve

__all__ = ["build_app", "listening_socket", "running_server", "serve"]
