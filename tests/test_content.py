"""Content addressing pieces: canonical JSON, token packing and deltas, the blob store, image extraction."""

from __future__ import annotations

import base64
import os
import threading

import pytest

from forge_store import BlobCorrupt, BlobNotFound, InvalidRecord, LocalBlobStore, canonical_json, json_sha256
from forge_store._images import REF_PREFIX, extract_images, restore_images
from forge_store._tokens import (
    common_prefix_items,
    ids_to_bytes,
    pack_ids,
    pack_logprobs,
    unpack_ids,
    unpack_logprobs,
)


def test_canonical_json_is_order_independent_and_strict():
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'.encode()
    assert json_sha256({"a": 1, "b": 2}) == json_sha256({"b": 2, "a": 1})
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


@pytest.mark.parametrize("ids", [[], [0], [1, 2, 3], list(range(100_000)), [2**32 - 1] * 70, [5] * 1000])
def test_token_arrays_round_trip(ids):
    assert unpack_ids(pack_ids(ids)) == ids


def test_repetitive_ids_are_compressed_and_random_ones_are_not():
    assert pack_ids([5] * 1000)[:1] == b"Z" and len(pack_ids([5] * 1000)) < 100
    random_ids = list(int.from_bytes(os.urandom(4), "little") for _ in range(500))
    assert pack_ids(random_ids)[:1] == b"I"


def test_token_ids_out_of_range():
    with pytest.raises(InvalidRecord, match="0 <= id < 2\\*\\*32"):
        pack_ids([-1])


def test_logprobs_round_trip_as_float32():
    values = [-0.1, -2.5, 0.0, -30.25]
    assert unpack_logprobs(pack_logprobs(values)) == pytest.approx(values, abs=1e-6)


@pytest.mark.parametrize("a, b, n", [([], [], 0), ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9], 1),
                                     ([9], [1], 0), (list(range(5000)), list(range(4000)) + [0], 4000)])
def test_common_prefix(a, b, n):
    assert common_prefix_items(ids_to_bytes(a), ids_to_bytes(b)) == n


def test_blob_store_dedups_and_detects_damage(tmp_path):
    blobs = LocalBlobStore(tmp_path)
    sha = blobs.put(b"hello")
    assert blobs.put(b"hello") == sha and blobs.get(sha) == b"hello"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [sha]
    blobs.path(sha).write_bytes(b"HELLO")
    with pytest.raises(BlobCorrupt, match=sha):
        blobs.get(sha)
    with pytest.raises(BlobNotFound, match="OPENFORGE_BLOB_DIR"):
        blobs.get("0" * 64)


def test_blob_writes_are_atomic_under_concurrency(tmp_path):
    blobs = LocalBlobStore(tmp_path)
    data = os.urandom(1 << 20)
    threads = [threading.Thread(target=blobs.put, args=(data,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].read_bytes() == data


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))
B64 = base64.b64encode(PNG).decode()


def _messages():
    return [
        {"role": "system", "content": "look"},
        {"role": "user", "content": [{"type": "text", "text": "what is this"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}",
                                                                         "detail": "low"}}]},
        {"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{B64}"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}]}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}}]},
    ]


def test_images_move_to_blobs_and_come_back_exactly(tmp_path):
    blobs = LocalBlobStore(tmp_path)
    original = _messages()
    stored, hashes = extract_images(original, lambda data, media: blobs.put(data))
    assert original == _messages()  # input untouched
    assert hashes == [blobs.put(PNG)] * 3
    assert B64 not in canonical_json(stored).decode()
    assert canonical_json(stored).decode().count(REF_PREFIX) == 3
    assert stored[0] is original[0] and stored[4] is original[4]  # untouched messages are not copied
    assert restore_images(stored, blobs.get) == original


def test_undecodable_image_names_the_message(tmp_path):
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]
    with pytest.raises(InvalidRecord, match="message 0: image data is not valid base64"):
        extract_images(bad, lambda d, m: "x")
    with pytest.raises(InvalidRecord, match="not base64"):
        extract_images([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,plain"}}]}],
                       lambda d, m: "x")


def test_common_prefix_agrees_with_a_plain_scan():
    import random

    rng = random.Random(7)
    for i in range(600):  # short ones, and long ones whose difference lies past the first slices compared
        size = rng.randrange(0, 60) if i % 2 else rng.randrange(0, 3000)
        a = [rng.randrange(3) for _ in range(size)]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        expect = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix_items(ids_to_bytes(a), ids_to_bytes(b)) == expect
        assert common_prefix_items(memoryview(ids_to_bytes(a)), bytearray(ids_to_bytes(b))) == expect


def test_ids_text_prefix_agrees_with_the_ids():
    import random

    from forge_store._tokens import IdsText, common_prefix_text

    rng = random.Random(11)
    for _ in range(500):
        a = [rng.choice([0, 1, 12, 123, 10, 100, 7]) for _ in range(rng.randrange(0, 8))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.choice([0, 1, 12, 123, 10, 100, 7]) for _ in range(rng.randrange(0, 4))]
        ta, tb = (",".join(map(str, x)).encode() for x in (a, b))
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        for n_a in (None, len(a)):  # counted on b's prefix, or on what a has past it
            items, cut = common_prefix_text(ta, tb, n_a)
            assert items == n, (a, b, n_a)
            assert IdsText(tb[cut:]).tolist() == b[n:], (a, b, cut)


@pytest.mark.parametrize("text, ok", [(b"1,2,3", True), (b"", True), (b"0,10,0", True), (b"4294967295", True),
                                      (b"4294967296", False), (b"1,,2", False), (b"01,2", False), (b"1,02", False)])
def test_ids_text_is_checked_in_full_when_packed(text, ok):
    """The proxy's loop takes digits and commas as ids (IdsText.parse); the writer checks what JSON would not
    allow there anyway (empty items, leading zeros) and the uint32 range."""
    from forge_store._tokens import IdsText, compress_packed

    assert IdsText.parse(text) is not None
    for other in (b'1,"2"', b"1,[2]", b"1, 2", b"-1,2", b"1.5", b"1e3", b"true", b"null", b",1", b"1,"):
        assert IdsText.parse(other) is None, other  # the plain parse decides
    if ok:
        ids = [int(x) for x in text.split(b",")] if text else []
        assert IdsText.parse(text).tolist() == ids and len(IdsText.parse(text)) == len(ids)
        assert compress_packed(b"T" + text) == b"I" + ids_to_bytes(ids)
    else:
        with pytest.raises(InvalidRecord):
            compress_packed(b"T" + text)


def test_ids_text_past_uint32_is_refused_when_packed():
    from forge_store._tokens import compress_packed

    assert compress_packed(b"T1,2") == b"I" + ids_to_bytes([1, 2])
    with pytest.raises(InvalidRecord, match="0 <= id < 2"):
        compress_packed(b"T1,4294967296")


def test_answers_give_their_prompt_ids_as_text_only_where_it_is_safe():
    import orjson

    from forge_store._tokens import IdsText
    from proxy._protocols.completion import loads_answer

    chat = {"id": "c", "choices": [{"index": 0, "message": {"content": 'say "prompt_token_ids":[1,2]'}}],
            "prompt_token_ids": [5, 60, 700]}
    data = loads_answer(orjson.dumps(chat), True)
    assert isinstance(data["prompt_token_ids"], IdsText) and data["prompt_token_ids"].tolist() == [5, 60, 700]
    assert data["choices"] == chat["choices"]  # the look-alike inside a string is left alone
    completion = {"choices": [{"text": "x", "prompt_token_ids": [1, 2], "token_ids": [3]}], "prompt_token_ids": None}
    data = loads_answer(orjson.dumps(completion), True)
    assert data["choices"][0]["prompt_token_ids"].tolist() == [1, 2] and data["choices"][0]["token_ids"] == [3]
    for odd in ({"prompt_token_ids": [1, "2"]}, {"prompt_token_ids": [[1]]}, {"prompt_token_ids": [1, -2]},
                {"usage": {}}, {"x": {"prompt_token_ids": [1]}}):
        assert loads_answer(orjson.dumps(odd), True) == odd  # the plain parse
    huge = loads_answer(orjson.dumps({"prompt_token_ids": [1, 2**32]}), True)["prompt_token_ids"]
    with pytest.raises(InvalidRecord):  # the writer's full check refuses it (a dead letter, kept on disk)
        huge.tolist()
    assert loads_answer(orjson.dumps(chat), False) == chat
