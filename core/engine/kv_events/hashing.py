"""The published block hash: the key llm-d's token processor computes for the same tokens.

llm-d (pkg/kvcache/kvblock/token_processor.go, chunkedTokenDatabase) keys a block by

    hash(parent, tokens, extra) = FNV-64a(canonical CBOR of [parent, tokens, extra])

chained from an initial hash per model, `hash(FNV-64a(hash_seed), nil, model_name)`, with `extra`
null for a text prompt. Publishing that value as the block hash makes the engine key equal llm-d's
request key: llm-d maps engine keys to the keys it computes from the event's tokens either way, and
a consumer that reads the hash directly finds the key it computes from a prompt.

Only the CBOR llm-d encodes here is needed: unsigned integers, arrays of them, null and a text
string, each in its shortest (canonical) form.
"""

from __future__ import annotations

from collections.abc import Sequence

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def fnv1a_64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def _head(major: int, n: int) -> bytes:
    """A CBOR item head: major type and argument in the shortest form (RFC 8949 4.2.1)."""
    m = major << 5
    if n < 24:
        return bytes((m | n,))
    if n < 1 << 8:
        return bytes((m | 24, n))
    if n < 1 << 16:
        return bytes((m | 25,)) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes((m | 26,)) + n.to_bytes(4, "big")
    return bytes((m | 27,)) + n.to_bytes(8, "big")


_NULL = b"\xf6"


def cbor_payload(parent: int, tokens: Sequence[int] | None, extra: str | None) -> bytes:
    """Canonical CBOR of [parent, tokens, extra] as Go's fxamacker/cbor writes it (a nil token
    slice and a nil extra are null)."""
    out = [b"\x83", _head(0, parent)]
    if tokens is None:
        out.append(_NULL)
    else:
        out.append(_head(4, len(tokens)))
        out.extend(_head(0, t) for t in tokens)
    if extra is None:
        out.append(_NULL)
    else:
        raw = extra.encode()
        out += [_head(3, len(raw)), raw]
    return b"".join(out)


class _TokenItems(dict[int, bytes]):
    """Each token id's CBOR item, made once: a block's payload is then one join."""

    def __missing__(self, token: int) -> bytes:
        item = self[token] = _head(0, token)
        return item


class BlockHasher:
    """llm-d's chained block keys for one served model; roots cached per model / adapter name."""

    def __init__(self, model_name: str, hash_seed: str = "") -> None:
        self.model_name = model_name
        self._seed = fnv1a_64(hash_seed.encode())
        self._roots: dict[str, int] = {}
        self._items = _TokenItems()

    def root(self, lora_name: str | None) -> int:
        """The parent of a sequence's first block. llm-d hashes a LoRA request's blocks under the
        adapter's name in place of the model's (the event's lora_name)."""
        name = self.model_name if lora_name is None else lora_name
        h = self._roots.get(name)
        if h is None:
            h = self._roots[name] = fnv1a_64(cbor_payload(self._seed, None, name))
        return h

    def block(self, parent: int, tokens: Sequence[int], images: Sequence[tuple[bytes, int]] = ()) -> int:
        """fnv1a_64(cbor_payload(parent, tokens, None)), the token items cached. A block an image
        overlaps carries the images as its extra keys, `[[content_hash, offset], ...]`, where llm-d
        puts null: the key differs from any text block's (llm-d, which sees token ids only, predicts
        no hit there, and a different image never shares it)."""
        items = b"".join(map(self._items.__getitem__, tokens))
        extra = _NULL
        if images:
            extra = _head(4, len(images)) + b"".join(
                _head(4, 2) + _head(2, len(h)) + h + _head(0, off) for h, off in images
            )
        return fnv1a_64(b"\x83" + _head(0, parent) + _head(4, len(tokens)) + items + extra)

    def chain(self, tokens: Sequence[int], block_size: int, lora_name: str | None = None) -> list[int]:
        """The keys of every full block of `tokens`, as llm-d computes them from a prompt."""
        keys: list[int] = []
        parent = self.root(lora_name)
        for i in range(len(tokens) // block_size):
            parent = self.block(parent, tokens[i * block_size : (i + 1) * block_size])
            keys.append(parent)
        return keys
