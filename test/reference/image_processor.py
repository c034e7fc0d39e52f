#!/usr/bin/env python3
"""Independent reference for lfc's image processor: Hugging Face's Qwen2-VL image processor (the
PIL-based one) as its code describes it, with PIL doing the resize, on generated images of awkward
sizes. Writes test/fixtures/image-processor/images.safetensors and meta.json:

    img{i}.input       U8  [H, W, 3]  the generated image
    img{i}.resized     U8  [h, w, 3]  PIL's bicubic resize to smart_resize's size
    img{i}.normalized  F32 [3, h, w]  rescaled by 1/255 and normalized with the model's mean / std

and, for the decoding, image files that PIL encodes (PNG of every colour mode, JPEG baseline,
progressive, grayscale, CMYK, with EXIF orientation) under files/, decoded as HF's pipeline does
(ImageOps.exif_transpose as load_image, then convert_to_rgb: a non-RGB image to RGBA,
alpha-composited onto white, to RGB), and files.safetensors:

    {file}.decoded     U8  [H, W, 3]  the decoded RGB image (alpha-table.png only)
    {file}.resized     U8  [h, w, 3]  PIL's bicubic resize of it to smart_resize's size

The normalized values of a file are those of its resized bytes (rescale and normalize as above,
which the generated images check); the bytes keep the fixture four times smaller.

Usage (Debian's python3-pil and numpy; torch is not needed):

    /usr/bin/python3 test/reference/image_processor.py --out test/fixtures/image-processor
"""

import argparse
import json
import math
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageCms, ImageOps

# Qwen2.5-VL's processor: patch 14 × merge 2, OpenAI CLIP's mean and std; a small max_pixels here
# so that the fixtures stay small (the rule is the same at any bound)
PATCH = 14
MERGE = 2
TEMPORAL_PATCH = 2
FACTOR = PATCH * MERGE
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 48
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
SIZES = [(37, 53), (123, 45), (200, 300), (64, 64), (9, 250), (300, 19), (57, 57)]


def smart_resize(height, width, factor=FACTOR, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS):
    """HF's rule: each side rounded to the factor, then scaled into [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of {height}x{width} is over 200")
    h_bar = round(height / factor) * factor  # Python's round: half to even
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_of(i, h, w):
    """a deterministic image: smooth gradients with noise and a hard edge"""
    rng = np.random.RandomState(1000 + i)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 127 + 100 * np.sin((x + y) / 7.0)], -1)
    base[(x // 5 + y // 3) % 2 == 0] *= 0.6
    noisy = base + rng.normal(0, 12, size=base.shape)
    return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def photo_of(i, h, w):
    """a photo-like image: smooth shapes of colour, one hard edge, mild sensor noise"""
    rng = np.random.RandomState(3000 + i)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    channels = []
    for c in range(3):
        f = rng.uniform(1, 6, size=(4, 2))
        v = sum(np.sin(2 * np.pi * (f[k, 0] * x + f[k, 1] * y) + rng.uniform(0, 6)) for k in range(4))
        channels.append(128 + 28 * v)
    base = np.stack(channels, -1)
    base[(x - 0.5) ** 2 + (y - 0.4) ** 2 < 0.04] = [230, 200, 60]
    noisy = base + rng.normal(0, 3, size=base.shape)
    return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def save(path, tensors):
    """safetensors: sorted names, header padded to 8 bytes with spaces, no __metadata__"""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = {np.uint8: "U8", np.float32: "F32"}[a.dtype.type]
        data = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def png_16bit(path, img):
    """a 16-bit PNG written by hand (PIL writes 16 bits only for one grayscale channel)"""
    h, w, c = img.shape
    colour_type = {3: 2, 4: 6}[c]  # RGB, RGBA

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in img)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour_type, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def alpha_of(i, h, w):
    """an alpha channel of every value: 0 and 255 bands, a ramp and noise in between"""
    rng = np.random.RandomState(2000 + i)
    y, x = np.mgrid[0:h, 0:w]
    a = 255 * (x + y) / max(h + w - 2, 1) + rng.normal(0, 20, size=(h, w))
    a[:, : max(1, w // 8)] = 0
    a[:, w - max(1, w // 8):] = 255
    return np.clip(np.round(a), 0, 255).astype(np.uint8)


def alpha_table():
    """86×256: alpha = column, and red, green and blue together take all 256 values in each column"""
    y, x = np.mgrid[0:86, 0:256]
    return np.stack([y, (y + 86) % 256, (y + 172) % 256, x], -1).astype(np.uint8)


def orientation(value):
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def xyz_profile():
    """an ICC profile that is not sRGB (lcms's XYZ), its creation date zeroed so the file repeats"""
    icc = bytearray(ImageCms.ImageCmsProfile(ImageCms.createProfile("XYZ")).tobytes())
    icc[24:36] = bytes(12)
    return bytes(icc)


def write_files(out):
    """the image files, each with how it was made; returns [(name, note)]"""
    os.makedirs(out, exist_ok=True)
    made = []

    def pil(name, im, note, **save):
        im.save(os.path.join(out, name), **save)
        made.append((name, note))

    def rgb(i, h, w):
        return Image.fromarray(image_of(100 + i, h, w), "RGB")

    pil("rgb.png", rgb(0, 37, 53), "RGB PNG")
    pil("gray.png", rgb(1, 123, 45).convert("L"), "grayscale PNG")
    pil("bilevel.png", rgb(2, 33, 70).convert("1"), "1-bit PNG (PIL's dithering)")
    rgba = np.dstack([image_of(103, 300, 19), alpha_of(3, 300, 19)])
    pil("rgba.png", Image.fromarray(rgba, "RGBA"), "RGBA PNG, alpha 0 to 255")
    la = np.dstack([np.asarray(rgb(4, 45, 60).convert("L")), alpha_of(4, 45, 60)])
    pil("gray-alpha.png", Image.fromarray(la, "LA"), "grayscale + alpha PNG")
    pil("alpha-table.png", Image.fromarray(alpha_table(), "RGBA"), "RGBA PNG: every (value, alpha) pair")
    pil("palette.png", rgb(5, 9, 250).quantize(64), "palette PNG, 64 colours")
    trns = bytes((17 * k) % 256 if k % 3 else (0 if k % 2 else 255) for k in range(32))
    pil("palette-trns.png", rgb(6, 57, 57).quantize(32), "palette PNG with tRNS", transparency=trns)
    pil("rgb-exif8.png", rgb(7, 20, 31), "RGB PNG, eXIf orientation 8 (shown turned 90° counter-clockwise)",
        exif=orientation(8))
    gray16 = (np.asarray(rgb(8, 50, 30).convert("L")).astype(np.uint16) * 256
              + np.random.RandomState(8).randint(0, 256, (50, 30))).astype(np.uint16)
    pil("gray16.png", Image.fromarray(gray16, "I;16"), "16-bit grayscale PNG")
    rgb16 = image_of(109, 40, 64).astype(np.uint16) * 256 + np.random.RandomState(9).randint(0, 256, (40, 64, 3))
    png_16bit(os.path.join(out, "rgb16.png"), rgb16)
    made.append(("rgb16.png", "16-bit RGB PNG (written by the script: PIL does not write them)"))
    rgba16 = np.dstack([image_of(110, 24, 31), alpha_of(10, 24, 31)]).astype(np.uint16) * 257
    png_16bit(os.path.join(out, "rgba16.png"), rgba16)
    made.append(("rgba16.png", "16-bit RGBA PNG (written by the script)"))

    pil("photo-448.jpg", Image.fromarray(photo_of(0, 448, 448)), "JPEG baseline 4:2:0, quality 90", quality=90)
    pil("photo-480x640.jpg", Image.fromarray(photo_of(1, 480, 640)), "JPEG baseline 4:2:0, quality 75", quality=75)
    pil("baseline-444.jpg", rgb(13, 45, 123), "JPEG baseline 4:4:4", quality=90, subsampling=0)
    pil("progressive.jpg", rgb(14, 123, 45), "progressive JPEG 4:2:0", quality=90, progressive=True)
    pil("gray.jpg", rgb(15, 53, 37).convert("L"), "grayscale JPEG", quality=90)
    pil("exif6.jpg", rgb(16, 60, 100), "JPEG with EXIF orientation 6 (shown turned 90° clockwise)",
        quality=90, exif=orientation(6))
    pil("icc-xyz.jpg", rgb(18, 37, 53), "JPEG with an ICC profile (XYZ), which PIL ignores", quality=90,
        icc_profile=xyz_profile())
    pil("cmyk.jpg", rgb(17, 32, 48).convert("CMYK"), "CMYK JPEG (Adobe, inverted)", quality=90)
    return made


def convert_to_rgb(im):
    """HF's convert_to_rgb: an image that is not RGB goes to RGBA and is composited onto white"""
    if im.mode == "RGB":
        return im
    rgba = im.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def decode_like_hf(path):
    """the RGB image HF's pipeline gets: load_image's EXIF transpose, then convert_to_rgb"""
    im = Image.open(path)
    im.load()
    mode = im.mode
    im = ImageOps.exif_transpose(im)
    if mode == "I":
        # PIL 9.4 opens a 16-bit grayscale PNG in mode I and clips it to 0..255 on conversion (an
        # image almost all white); lfc keeps the high byte of each sample, the image the file holds
        high = (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)
        return mode, np.stack([high] * 3, -1), "high byte of each sample (PIL 9.4 clips to 0..255)"
    return mode, np.asarray(convert_to_rgb(im)), "PIL"


# the file whose decoded image the fixture holds too: every (value, alpha) pair composited, which a
# resize could blur; for the others the resized bytes show the decoding
DECODED = {"alpha-table.png"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test/fixtures/image-processor")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tensors, meta = {}, []
    for i, (h, w) in enumerate(SIZES):
        img = image_of(i, h, w)
        rh, rw = smart_resize(h, w)
        resized = np.asarray(Image.fromarray(img, "RGB").resize((rw, rh), resample=Image.BICUBIC))
        x = resized.astype(np.float64) * (1 / 255)
        x = x.astype(np.float32)
        x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
        tensors[f"img{i}.input"] = img
        tensors[f"img{i}.resized"] = resized
        tensors[f"img{i}.normalized"] = x.transpose(2, 0, 1).astype(np.float32)
        meta.append({"height": h, "width": w, "resized": [rh, rw]})
    save(os.path.join(args.out, "images.safetensors"), tensors)

    file_tensors, files = {}, []
    for name, note in write_files(os.path.join(args.out, "files")):
        mode, rgb, expected = decode_like_hf(os.path.join(args.out, "files", name))
        h, w = rgb.shape[:2]
        rh, rw = smart_resize(h, w)
        resized = np.asarray(Image.fromarray(rgb, "RGB").resize((rw, rh), resample=Image.BICUBIC))
        if name in DECODED:
            file_tensors[f"{name}.decoded"] = rgb
        file_tensors[f"{name}.resized"] = resized
        files.append({"file": name, "what": note, "pil_mode": mode, "height": h, "width": w,
                      "resized": [rh, rw], "grid": [1, rh // PATCH, rw // PATCH],
                      "decoded": name in DECODED, "expected": expected})
    save(os.path.join(args.out, "files.safetensors"), file_tensors)

    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump({"factor": FACTOR, "patch": PATCH, "merge": MERGE, "temporal_patch": TEMPORAL_PATCH,
                   "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "mean": MEAN, "std": STD,
                   "pil": Image.__version__, "images": meta, "files": files}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
