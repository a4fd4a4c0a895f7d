"""POST /tokenize: a text as the served model's tokenizer encodes it, in vLLM's shape.

A gateway that encodes prompts itself checks with this route, at start-up, that its tokenizer is
the server's: `{"model", "prompt", "add_special_tokens"}` in, `{"count", "max_model_len",
"tokens"}` out (and `token_strs` on request). The body is parsed as a completion's is
(`parsed`), and the text encoded as a completion's string prompt is (completions.py), in a
worker thread, within the same size limit; the answer, with its token strings, is made in that
thread too (a long text's are a million tokens: 0.8 s of the event loop).
"""

from __future__ import annotations

from starlette.responses import Response

from engine.openai_api.completions import Served, parsed, tokenized
from engine.openai_api.errors import BadRequest, UnknownModel
from engine.openai_api.protocol import TokenizeResponse, parse_tokenize


async def tokenize(served: Served, body: bytes) -> Response:
    request = await parsed(served, parse_tokenize, body)
    if request.model is not None and request.model != served.model_name:
        raise UnknownModel(f"the model `{request.model}` does not exist", "model")
    if len(request.prompt) > served.max_prompt_chars:
        raise BadRequest(
            f"the prompt has {len(request.prompt)} characters; at most {served.max_prompt_chars}",
            "prompt",
        )

    def answer() -> str:
        tokenizer = served.tokenizer
        ids = list(tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
        strs = tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        reply = TokenizeResponse(
            count=len(ids), max_model_len=served.max_model_len, tokens=ids, token_strs=strs
        )
        return reply.model_dump_json()

    reply = await tokenized(served, request.prompt, answer)
    return Response(reply, media_type="application/json")
