from tests.engine.factories import make_request


def test_token_slice_matches_slicing_all_tokens() -> None:
    req = make_request("a", prompt_len=5)
    req.output_token_ids = [901, 902, 903]
    tokens = req.all_token_ids
    for start in range(len(tokens) + 1):
        for end in range(start, len(tokens) + 1):
            assert req.token_slice(start, end) == tokens[start:end]
