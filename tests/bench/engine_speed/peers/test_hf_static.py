from bench.engine_speed.peers.hf_static import left_pad


def test_left_pad_aligns_prompts_right() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids == [[5, 6, 7], [0, 0, 8]]
    assert mask == [[1, 1, 1], [0, 0, 1]]
