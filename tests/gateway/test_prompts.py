"""PromptEncoder gives exactly apply_chat_template's ids, on tokenizers it can split and others."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.loader import load_tokenizer, resolve_model
from gateway.jobs.model import ChatMessage
from gateway.prompts import Prompt, PromptEncoder, encode_prompt

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Added tokens that overlap (one is a prefix of another) and a plain-text one.
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|im", "<|endoftext|>"]
CORPUS = ["you are a helpful assistant", "the quick brown fox", "über 日本 café"] * 20
PIECES = ["a", "fox", " ", "  ", "\n", "\t", "é", "日本", "<", "|", ">", "im", " <|im_end|> "]
PIECES += SPECIAL


def chat_tokenizer(
    pre_tokenizer: pre_tokenizers.PreTokenizer, *, lstrip: bool = False
) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS, trainer)
    backend.add_special_tokens([AddedToken(t, lstrip=lstrip, normalized=False) for t in SPECIAL])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    return tokenizer


def random_prompts(seed: int, count: int) -> list[Prompt]:
    rng = random.Random(seed)

    def text() -> str:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))

    prompts: list[Prompt] = []
    for i in range(count):
        roles = rng.choices(["system", "user", "assistant"], k=rng.randint(1, 3))
        chat = tuple(ChatMessage(role, text()) for role in roles)
        prompts.append(chat if i % 2 else text())
    return prompts


def test_pieces_give_the_template_ids_exactly() -> None:
    tokenizer = chat_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False))
    encoder = PromptEncoder(tokenizer, cache_bytes=8192)  # small: pieces are evicted
    for prompt in random_prompts(0, 400):
        assert encoder(prompt) == encode_prompt(tokenizer, prompt), prompt


@pytest.mark.parametrize(
    ("pre_tokenizer", "lstrip"),
    [
        (pre_tokenizers.ByteLevel(add_prefix_space=False), True),  # tokens eat spaces
        (pre_tokenizers.Metaspace(prepend_scheme="first"), False),  # only the first piece
    ],
)
def test_tokenizers_whose_pieces_interact_get_the_same_ids(
    pre_tokenizer: pre_tokenizers.PreTokenizer, lstrip: bool
) -> None:
    tokenizer = chat_tokenizer(pre_tokenizer, lstrip=lstrip)
    encoder = PromptEncoder(tokenizer)
    for prompt in random_prompts(1, 200):
        assert encoder(prompt) == encode_prompt(tokenizer, prompt), prompt


def test_each_call_returns_its_own_list() -> None:
    encoder = PromptEncoder(chat_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False)))
    first = encoder("the fox")
    first.append(-1)
    assert encoder("the fox") == first[:-1]


@pytest.mark.integration
def test_smollm2_ids_match_apply_chat_template() -> None:
    tokenizer = load_tokenizer(resolve_model("default"))
    encoder = PromptEncoder(tokenizer)
    for prompt in [*random_prompts(2, 300), "ping", (ChatMessage("system", "Be brief."),)]:
        assert encoder(prompt) == encode_prompt(tokenizer, prompt), prompt
