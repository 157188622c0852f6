"""A request's images, loaded and decoded before its body is parsed (core/vision/front.py's step 1).

The API's image parts are found (api_parts.py) and checked first: a model without vision refuses
the first one, more than `max_images` refuses the first over the limit, and each part's shape is
read into an `ImageSource`; nothing is fetched or decoded for a request that fails these. The
images then load concurrently: http(s) fetches on the event loop (fetch.py), base64 decoding,
file reads (local.py) and Pillow's decoding in the default executor. Any refusal is the 400 of
`image_refused`, naming the part; the first failing part in request order is the one reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rillet.core.config.vision import VisionConfig
from rillet.core.vision.front import VisionFront
from rillet.core.vision.image import ImageError, ImageErrorKind, ImageInput, decode_image
from rillet.http.openai.chat_messages import Images
from rillet.http.openai.errors import image_refused
from rillet.http.openai.fields import Body
from rillet.http.vision.api_parts import ImageApi
from rillet.http.vision.fetch import Fetcher
from rillet.http.vision.local import read_local
from rillet.http.vision.sources import ImageSource, decode_base64


class ImageLoader:
    def __init__(self, cfg: VisionConfig) -> None:
        self._cfg = cfg
        self.fetcher = Fetcher(cfg)

    async def request_images(
        self, body: Body, api: ImageApi, vision: VisionFront | None, model: str
    ) -> Images:
        """The body's images by part; empty when it has none."""
        found = api.locate(body)
        if not found:
            return {}
        try:
            if vision is None:
                msg = f"the model '{model}' does not take images"
                raise ImageError(ImageErrorKind.NOT_SUPPORTED, found[0][0], msg)
            if len(found) > vision.max_images:
                msg = f"the request has {len(found)} images; at most {vision.max_images} (vision.max_images)"
                raise ImageError(ImageErrorKind.TOO_MANY_IMAGES, found[vision.max_images][0], msg)
            sources = [api.source(part, where) for where, part in found]
            images = await self._load_all(sources, vision.max_pixels)
        except ImageError as e:
            raise image_refused(e) from e
        return {image.part: image for image in images}

    async def _load_all(self, sources: Sequence[ImageSource], max_pixels: int) -> list[ImageInput]:
        tasks = [asyncio.ensure_future(self._load(s, max_pixels)) for s in sources]
        try:
            return [await t for t in tasks]
        finally:  # after a failure (or the client leaving) the others stop; none logs a lost error
            for t in tasks:
                if not t.done():
                    t.cancel()
                elif not t.cancelled():
                    t.exception()

    async def _load(self, src: ImageSource, max_pixels: int) -> ImageInput:
        cfg, loop = self._cfg, asyncio.get_running_loop()
        if src.kind == "base64":
            return await loop.run_in_executor(
                None, _from_base64, src.value, src.part, cfg.max_image_bytes, max_pixels
            )
        if src.kind == "path":
            return await loop.run_in_executor(
                None, _from_file, src.value, src.part, cfg.allowed_local_path, cfg.max_image_bytes, max_pixels
            )
        data = await self.fetcher.fetch(src.value, src.part)
        return await loop.run_in_executor(None, decode_image, data, src.part, max_pixels)


def _from_base64(payload: str, part: str, max_bytes: int, max_pixels: int) -> ImageInput:
    return decode_image(decode_base64(payload, part, max_bytes), part, max_pixels)


def _from_file(path: str, part: str, root: str | None, max_bytes: int, max_pixels: int) -> ImageInput:
    return decode_image(read_local(path, part, root, max_bytes), part, max_pixels)
