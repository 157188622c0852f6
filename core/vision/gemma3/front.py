"""Gemma 3's `VisionFront`: the chat template writes `<start_of_image>` for each image; the
processor (transformers' Gemma3Processor) turns each into
`\\n\\n<start_of_image>` + mm_tokens_per_image x `<image_soft_token>` + `<end_of_image>\\n\\n`
and tokenizes the text. Here the same is done on ids: the two `\\n\\n` join the newlines beside
them into one run, tokenized as the tokenizer tokenizes that run (Gemma's vocabulary has a token
for each run of up to 31 newlines: "\\n" before the image and "\\n\\n" make one "\\n\\n\\n").

Torch-free and stateless after construction: the HTTP layer's threads may call `expand` at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rillet.core.vision.front import MultimodalPrompt
from rillet.core.vision.gemma3.config import Gemma3Preprocess, Gemma3VisionArch
from rillet.core.vision.gemma3.preprocess import pixel_values
from rillet.core.vision.image import ImageError, ImageErrorKind, ImageInput
from rillet.core.vision.payload import MmItem, MmPayload

DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_PIXELS = 8192 * 8192
MAX_NEWLINE_RUN = 31  # the longest run of newlines Gemma's vocabulary holds as one token


class Gemma3Front:
    def __init__(
        self,
        arch: Gemma3VisionArch,
        pre: Gemma3Preprocess,
        encode: Callable[[str], list[int]],  # text -> ids, no special tokens added
        max_images: int = DEFAULT_MAX_IMAGES,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.arch = arch
        self.pre = pre
        self.encode = encode
        self.max_images = max_images
        self.max_pixels = max_pixels
        # one image's tokens, attended bidirectionally: a prefill chunk holds them whole
        self.image_block_tokens = arch.mm_tokens_per_image
        # id -> how many newlines it is, for the ids that are a run of newlines alone
        self.newlines: dict[int, int] = {}
        for n in range(1, MAX_NEWLINE_RUN + 1):
            ids = encode("\n" * n)
            if len(ids) == 1:
                self.newlines[ids[0]] = n

    def expand(self, prompt_ids: list[int], images: Sequence[ImageInput]) -> MultimodalPrompt:
        a = self.arch
        marks = sum(1 for t in prompt_ids if t == a.boi_token_id)
        if len(images) > self.max_images:
            part = images[self.max_images].part
            msg = f"{len(images)} images, over the limit of {self.max_images}"
            raise ImageError(ImageErrorKind.TOO_MANY_IMAGES, part, msg)
        if marks != len(images):
            part = images[0].part if images else "messages"
            msg = f"the prompt has {marks} image placeholders for {len(images)} images"
            raise ImageError(ImageErrorKind.NOT_SUPPORTED, part, msg)
        if not images:
            return MultimodalPrompt(list(prompt_ids), 0, None)
        ids = self._expanded_ids(prompt_ids)
        starts = [i + 1 for i, t in enumerate(ids) if t == a.boi_token_id]
        items = tuple(
            MmItem(at, a.mm_tokens_per_image, img.content_hash, pixel_values(img.image, self.pre))
            for at, img in zip(starts, images, strict=True)
        )
        return MultimodalPrompt(ids, len(items) * a.mm_tokens_per_image, MmPayload(items, bidirectional=True))

    def _expanded_ids(self, prompt_ids: list[int]) -> list[int]:
        """Each `<start_of_image>` as its full sequence; every run of newlines that touches an
        inserted "\n\n" tokenized again as one run."""
        a = self.arch
        block = [a.boi_token_id] + [a.image_token_id] * a.mm_tokens_per_image + [a.eoi_token_id]
        # (id, newlines, inserted): newlines 0 for any other token; an inserted "\n\n" has id -1
        pieces: list[tuple[int, int, bool]] = []
        for t in prompt_ids:
            if t == a.boi_token_id:
                pieces.append((-1, 2, True))
                pieces += [(b, 0, False) for b in block]
                pieces.append((-1, 2, True))
            else:
                pieces.append((t, self.newlines.get(t, 0), False))
        out: list[int] = []
        i = 0
        while i < len(pieces):
            j = i
            while j < len(pieces) and pieces[j][1] > 0:
                j += 1
            if j == i:
                out.append(pieces[i][0])
                i += 1
                continue
            run = pieces[i:j]
            if any(ins for _, _, ins in run):
                out += self.encode("\n" * sum(n for _, n, _ in run))
            else:
                out += [t for t, _, _ in run]
            i = j
        return out
