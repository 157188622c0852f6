"""One image of a request, decoded once: Pillow opens the bytes, the first frame is taken (GIF), the
pixels are made RGB the way transformers' processors do (transparency over white), and the pixels'
hash names the image for the encoder cache and the prefix cache.

Every refusal is an `ImageError` with a kind and the request part it came from, so each front end
answers a 400 naming that part. Torch-free."""

from __future__ import annotations

import enum
import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError


class ImageErrorKind(enum.Enum):
    NOT_BASE64 = "not_base64"  # a data: URL whose payload is not base64
    NOT_AN_IMAGE = "not_an_image"  # bytes Pillow cannot identify
    TRUNCATED = "truncated"  # identified, but the pixel data ends early or is corrupt
    TOO_MANY_PIXELS = "too_many_pixels"  # width x height over the limit (checked before decoding)
    TOO_LARGE = "too_large"  # more bytes than the limit
    FORBIDDEN = "forbidden"  # a URL or path the configuration does not allow (SSRF guard)
    FETCH_FAILED = "fetch_failed"  # an allowed URL that could not be fetched
    TOO_MANY_IMAGES = "too_many_images"  # more images in the request than the limit
    NOT_SUPPORTED = "not_supported"  # the served model does not take images


class ImageError(ValueError):
    """A refused image: `part` names where it was in the request (e.g. `messages[1].content[0]`)."""

    def __init__(self, kind: ImageErrorKind, part: str, message: str) -> None:
        super().__init__(f"{part}: {message}")
        self.kind = kind
        self.part = part
        self.message = message


@dataclass(frozen=True, eq=False)
class ImageInput:
    """A decoded RGB image, where it came from, and the hash of its pixels (size included)."""

    image: Image.Image
    part: str
    content_hash: bytes  # sha256 of (width, height, RGB bytes): same pixels, same hash, any format


def decode_image(data: bytes, part: str, max_pixels: int) -> ImageInput:
    """`max_pixels` bounds width x height before any pixel is decoded (decompression bombs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageError(ImageErrorKind.TOO_MANY_PIXELS, part, "the image has too many pixels") from e
        except (UnidentifiedImageError, OSError) as e:
            msg = "the data is not an image Pillow can read"
            raise ImageError(ImageErrorKind.NOT_AN_IMAGE, part, msg) from e
    w, h = img.size
    if w * h > max_pixels:
        msg = f"the image is {w}x{h}, over the limit of {max_pixels} pixels"
        raise ImageError(ImageErrorKind.TOO_MANY_PIXELS, part, msg)
    try:
        img.seek(0)  # an animation's first frame
        img.load()
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(ImageErrorKind.TRUNCATED, part, "the image data is truncated or corrupt") from e
    rgb = to_rgb(img)
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return ImageInput(rgb, part, digest.digest())


def to_rgb(img: Image.Image) -> Image.Image:
    """transformers' `convert_to_rgb`: an image with transparency is composited over white."""
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")
