"""JPEG frames at the node: a structural check at intake (cheap, no pixel decoded) and the decode later.

The node keeps JPEG frames compressed and decodes one only when a window uses it (`DecodePool`), so a
peer cannot make the intake thread decode. What intake can check without decoding, `inspect_jpeg` checks:

* the frame header (SOF) says the size the message header says (Pillow reads it without decoding);
* decoded size / wire size is at most `max_ratio`: a 1.8 KB JPEG claiming 3840x2160 (24.9 MB decoded, a
  ratio of 13,800) is rejected. Real frames stay far below: Pillow's all-black 1920x1080 frame, the most
  compressible there is, measured 497 (optimised Huffman tables), 487 (progressive), 187 (default);
* the marker structure: segment lengths inside the payload, restart markers in sequence, nothing but
  fill bytes between segments, the payload ending exactly with the end-of-image marker (else truncated or
  trailing data);
* for sequential (baseline) Huffman JPEGs, entropy-coded data of at least 2 bits per 8x8 block: every block
  codes a DC difference and an end-of-block, each at least 1 bit, so less data means blocks are missing
  (libjpeg would pad them silently, with a warning Pillow does not surface).

A JPEG that passes can still fail to decode (a damaged Huffman table, say): Pillow's error is then the
cause. Bit flips inside entropy-coded data can decode to a wrong image that no check here can tell apart
from a right one without the sensor's own checksum.
"""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
from PIL import Image

SOI, EOI, SOS = 0xD8, 0xD9, 0xDA
SOF_SEQUENTIAL = (0xC0, 0xC1)  # baseline and extended sequential, Huffman coded
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # C4 DHT, C8 reserved, CC DAC
RST0 = 0xD0
MIN_BITS_PER_BLOCK = 2  # a Huffman DC code and an end-of-block code, each at least 1 bit
DECODE_POLL_S = 0.01  # how often `DecodePool.decode` reads a running decode's CPU time


class JpegError(ValueError):
    """A JPEG that is rejected; the message says why (truncated, damaged, a decompression bomb)."""


class JpegSizeError(JpegError):
    """The JPEG's own frame header gives another size than the message header."""


@dataclass(frozen=True)
class JpegLayout:
    """What the marker walk found: image size (px), colour components, whether sequential Huffman, 8x8 blocks
    (MCU-padded) and the bytes of entropy-coded data."""

    width: int
    height: int
    components: int  # 3: YCbCr (decoded to RGB); 1: greyscale; 4: CMYK
    sequential: bool
    blocks: int
    entropy_bytes: int


def inspect_jpeg(data: bytes, width: int, height: int, max_ratio: float) -> JpegLayout:
    """Check a JPEG payload against the header's `width` x `height` without decoding a pixel; raises
    JpegError naming the cause."""
    if len(data) < 2 or data[0] != 0xFF or data[1] != SOI:
        raise JpegError("payload does not start with the JPEG SOI marker FF D8")
    ratio = width * height * 3 / len(data)
    if ratio > max_ratio:
        raise JpegError(
            f"decompression bomb: {width}x{height} RGB is {width * height * 3} bytes from {len(data)} on the "
            f"wire, a ratio of {ratio:.0f} (limit {max_ratio:g})"
        )
    layout = _walk(data)
    if (layout.width, layout.height) != (width, height):
        raise JpegSizeError(f"jpeg is {layout.width}x{layout.height}, header says {width}x{height}")
    if layout.components != 3:
        raise JpegError(f"has {layout.components} colour component(s), expected 3 (YCbCr, decoded to RGB)")
    need = layout.blocks * MIN_BITS_PER_BLOCK // 8
    if layout.sequential and layout.entropy_bytes < need:
        raise JpegError(
            f"damaged: {layout.entropy_bytes} bytes of entropy-coded data, a {width}x{height} sequential JPEG "
            f"needs at least {need} ({MIN_BITS_PER_BLOCK} bits per 8x8 block): blocks are missing"
        )
    return layout


def _walk(data: bytes) -> JpegLayout:
    """Walk the marker segments and entropy-coded scans of a JPEG to its EOI."""
    n, i = len(data), 2
    size: tuple[int, int] | None = None
    sequential, blocks, components, entropy = False, 0, 0, 0
    while True:
        if i + 2 > n:
            raise JpegError(f"truncated: ends at byte {n} before the end-of-image marker")
        if data[i] != 0xFF:
            raise JpegError(f"damaged: byte {i} is 0x{data[i]:02X} where a marker was expected")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker == EOI:
            if i + 2 != n:
                raise JpegError(f"damaged: {n - i - 2} bytes after the end-of-image marker")
            break
        if marker == SOI or RST0 <= marker <= RST0 + 7 or marker in (0x00, 0x01):
            raise JpegError(f"damaged: marker FF {marker:02X} at byte {i} outside a scan")
        if i + 4 > n:
            raise JpegError(f"truncated: ends inside the segment at byte {i}")
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        end = i + 2 + length
        if length < 2 or end > n:
            raise JpegError(
                f"truncated: segment FF {marker:02X} at byte {i} claims {length} bytes, {n - i - 2} left"
            )
        if marker in SOF_MARKERS:
            size, blocks, components = _frame_header(data[i + 4 : end])
            sequential = marker in SOF_SEQUENTIAL
        i = end
        if marker == SOS:
            j = _scan_end(data, i)
            entropy += j - i
            i = j
    if size is None:
        raise JpegError("damaged: no frame header (SOF) before the end-of-image marker")
    return JpegLayout(size[0], size[1], components, sequential, blocks, entropy)


def _frame_header(seg: bytes) -> tuple[tuple[int, int], int, int]:
    """(width, height), the number of 8x8 blocks (MCU-padded) and of components from an SOF segment body."""
    if len(seg) < 6 or len(seg) != 6 + 3 * seg[5] or seg[5] == 0:
        raise JpegError(
            f"damaged: frame header of {len(seg)} bytes for {seg[5] if len(seg) > 5 else 0} components"
        )
    height, width = int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big")
    factors = [(seg[7 + 3 * c] >> 4, seg[7 + 3 * c] & 15) for c in range(seg[5])]
    if width == 0 or height == 0 or not all(1 <= h <= 4 and 1 <= v <= 4 for h, v in factors):
        raise JpegError(f"damaged: frame header says {width}x{height}, sampling factors {factors}")
    hmax, vmax = max(h for h, _ in factors), max(v for _, v in factors)
    mcus = -(-width // (8 * hmax)) * -(-height // (8 * vmax))
    return (width, height), mcus * sum(h * v for h, v in factors), len(factors)


def _scan_end(data: bytes, start: int) -> int:
    """Offset of the marker that ends the entropy-coded data starting at `start` (restart markers, which must
    come in sequence RST0..RST7, and stuffed FF 00 bytes are part of it)."""
    n, j, rst = len(data), start, 0
    while True:
        k = data.find(b"\xff", j)
        if k < 0 or k + 1 >= n:
            raise JpegError("truncated: entropy-coded data runs to the end without an end-of-image marker")
        nxt = data[k + 1]
        if nxt == 0x00 or nxt == 0xFF:  # stuffed byte; fill byte before a marker
            j = k + 1 + (nxt == 0x00)
        elif RST0 <= nxt <= RST0 + 7:
            if nxt != RST0 + rst:
                raise JpegError(f"damaged: restart marker RST{nxt - RST0} at byte {k}, expected RST{rst}")
            rst, j = (rst + 1) % 8, k + 2
        else:
            return k


def decode_jpeg(data: bytes) -> np.ndarray:
    """[height, width, 3] uint8 RGB pixels of a JPEG that passed `inspect_jpeg`; raises JpegError with
    Pillow's cause (truncated, a damaged table or scan, a mode other than RGB)."""
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
            if img.mode != "RGB":
                raise JpegError(f"jpeg mode is {img.mode!r}, expected 'RGB' (3 channels)")
            img.load()
            return np.asarray(img)
    except JpegError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise JpegError(f"does not decode: {e}") from None


class DecodePool:
    """Decodes JPEG frames on `threads` worker threads (Pillow releases the GIL while decoding, so intake and
    control keep running), each within `budget_ms` of its thread's CPU time. CPU time, not elapsed time: a loaded
    machine only delays a decode, and a frame rejected for that would be a good frame lost (a window that needs
    it then never forms)."""

    def __init__(self, threads: int, budget_ms: float):
        self.threads, self.budget_ms = threads, budget_ms
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="node-jpeg")

    def decode(self, jpegs: list[bytes]) -> list[tuple[np.ndarray, float] | JpegError]:
        """Per JPEG, (pixels, decode ms elapsed) or the error. A decode that has used the budget of CPU time and
        is still running is reported and left to finish; one waiting for a pool thread, or for a CPU, is waited
        for."""
        jobs = [_Decode(data, self.budget_ms) for data in jpegs]
        futures = [self._pool.submit(job.run) for job in jobs]
        while True:
            _, pending = wait(futures, timeout=DECODE_POLL_S)
            if all(
                job.cpu_ms() > self.budget_ms for job, f in zip(jobs, futures, strict=True) if f in pending
            ):
                break
        return [
            f.result()
            if f.done()
            else JpegError(f"decode still running after {self.budget_ms:g} ms of CPU time (its budget)")
            for f in futures
        ]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Decode:
    """One frame's decode on a pool thread, with that thread's CPU clock, so the caller can read the CPU time
    the decode has used while it runs."""

    def __init__(self, data: bytes, budget_ms: float):
        self.data, self.budget_ms = data, budget_ms
        self._clock: int | None = None  # the running thread's CPU clock, set when the decode starts
        self._cpu_start = 0.0

    def cpu_ms(self) -> float:
        """CPU time this decode has used so far (0 before it starts)."""
        clock = self._clock
        return 0.0 if clock is None else (time.clock_gettime(clock) - self._cpu_start) * 1e3

    def run(self) -> tuple[np.ndarray, float] | JpegError:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        self._cpu_start = time.clock_gettime(clock)
        self._clock = clock
        start = time.perf_counter()
        try:
            image = decode_jpeg(self.data)
        except JpegError as e:
            return e
        cpu_ms = self.cpu_ms()
        if cpu_ms > self.budget_ms:
            return JpegError(
                f"decode took {cpu_ms:.0f} ms of CPU time, over the budget of {self.budget_ms:g} ms"
            )
        return image, (time.perf_counter() - start) * 1e3
