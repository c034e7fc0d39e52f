// What an image file's headers say, read in a few microseconds where a call into sharp costs a
// few hundred: a PNG's or JPEG's size, its EXIF orientation, a JPEG's colour components. The
// loader sizes every sample of the global batch from these (runtime/data/loader.ts), so that a
// step of small images is not spent waiting on calls.
//
//   PNG   IHDR (width, height), an eXIf chunk anywhere (a TIFF structure: its orientation)
//   JPEG  the frame header SOF0–SOF15 but DHT, JPG and DAC (height, width, components), APP1
//         "Exif\0\0" + TIFF (orientation)
//   TIFF  II or MM, 42, IFD0's entries: tag 0x0112 (Orientation), a SHORT, 1–8 (else 1)
// Orientations 5–8 turn the image a quarter: width and height swap (PIL's exif_transpose).

export interface ImageHeader {
  readonly format: 'png' | 'jpeg';
  /** as stored, before orientation */
  readonly width: number;
  readonly height: number;
  /** EXIF orientation, 1 (as stored) to 8 */
  readonly orientation: number;
  /** JPEG: colour components (4: CMYK or YCCK) */
  readonly components?: number;
}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

const u16 = (b: Uint8Array, at: number, little: boolean) =>
  little ? b[at] | (b[at + 1] << 8) : (b[at] << 8) | b[at + 1];
const u32 = (b: Uint8Array, at: number, little: boolean) =>
  little
    ? (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0
    : ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;

/** The Orientation tag of a TIFF structure's first IFD: 1–8, or 1 when absent or invalid. */
export function tiffOrientation(t: Uint8Array): number {
  if (t.length < 8) return 1;
  const little = t[0] === 0x49 && t[1] === 0x49;
  if (!little && !(t[0] === 0x4d && t[1] === 0x4d)) return 1;
  if (u16(t, 2, little) !== 42) return 1;
  const ifd = u32(t, 4, little);
  if (ifd + 2 > t.length) return 1;
  const entries = u16(t, ifd, little);
  for (let k = 0; k < entries; k++) {
    const at = ifd + 2 + 12 * k;
    if (at + 12 > t.length) return 1;
    if (u16(t, at, little) !== 0x0112) continue;
    if (u16(t, at + 2, little) !== 3) return 1; // not a SHORT
    const v = u16(t, at + 8, little);
    return v >= 1 && v <= 8 ? v : 1;
  }
  return 1;
}

function pngHeader(b: Uint8Array): ImageHeader | undefined {
  if (b.length < 33 || PNG_SIGNATURE.some((x, i) => b[i] !== x)) return undefined;
  if (String.fromCharCode(b[12], b[13], b[14], b[15]) !== 'IHDR') return undefined;
  const width = u32(b, 16, false);
  const height = u32(b, 20, false);
  let orientation = 1;
  // the chunks: length, type, data, CRC
  for (let at = 8; at + 8 <= b.length;) {
    const length = u32(b, at, false);
    const type = String.fromCharCode(b[at + 4], b[at + 5], b[at + 6], b[at + 7]);
    if (type === 'eXIf') orientation = tiffOrientation(b.subarray(at + 8, at + 8 + length));
    if (type === 'IEND') break;
    at += 12 + length;
  }
  return { format: 'png', width, height, orientation };
}

function jpegHeader(b: Uint8Array): ImageHeader | undefined {
  if (b.length < 4 || b[0] !== 0xff || b[1] !== 0xd8) return undefined;
  let orientation = 1;
  for (let at = 2; at + 4 <= b.length;) {
    if (b[at] !== 0xff) return undefined;
    const marker = b[at + 1];
    if (marker === 0xff) {
      at++; // fill byte
      continue;
    }
    if (marker === 0xd8 || marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {
      at += 2; // no length
      continue;
    }
    const length = u16(b, at + 2, false);
    const body = at + 4;
    if (
      marker === 0xe1 &&
      length >= 8 &&
      String.fromCharCode(b[body], b[body + 1], b[body + 2], b[body + 3]) === 'Exif' &&
      b[body + 4] === 0 &&
      b[body + 5] === 0
    )
      orientation = tiffOrientation(b.subarray(body + 6, at + 2 + length));
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      if (body + 6 > b.length) return undefined;
      return {
        format: 'jpeg',
        height: u16(b, body + 1, false),
        width: u16(b, body + 3, false),
        components: b[body + 5],
        orientation,
      };
    }
    if (marker === 0xda) return undefined; // a scan before any frame header
    at += 2 + length;
  }
  return undefined;
}

/** The header of a PNG or JPEG; undefined for other formats or headers that do not parse. */
export function imageHeader(b: Uint8Array): ImageHeader | undefined {
  return pngHeader(b) ?? jpegHeader(b);
}

/** The size the image shows once its orientation is applied. */
export function orientedSize(h: ImageHeader): { width: number; height: number } {
  return h.orientation >= 5
    ? { width: h.height, height: h.width }
    : { width: h.width, height: h.height };
}
