#!/usr/bin/env python3
"""Independent reference for lfc's image processor: Hugging Face's Qwen2-VL image processor (the
PIL-based one) as its code describes it, with PIL doing the resize, on generated images of awkward
sizes. Writes test/fixtures/image-processor/images.safetensors and meta.json:

    img{i}.input       U8  [H, W, 3]  the generated image
    img{i}.resized     U8  [h, w, 3]  PIL's bicubic resize to smart_resize's size
    img{i}.normalized  F32 [3, h, w]  rescaled by 1/255 and normalized with the model's mean / std

Usage (Debian's python3-pil and numpy; torch is not needed):

    /usr/bin/python3 test/reference/image_processor.py --out test/fixtures/image-processor
"""

import argparse
import json
import math
import os
import struct

import numpy as np
from PIL import Image

# Qwen2.5-VL's processor: patch 14 × merge 2, OpenAI CLIP's mean and std; a small max_pixels here
# so that the fixtures stay small (the rule is the same at any bound)
FACTOR = 28
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
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump({"factor": FACTOR, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "mean": MEAN,
                   "std": STD, "pil": Image.__version__, "images": meta}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
