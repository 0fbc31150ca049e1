"""The AlpaSim service's cost per `drive` beyond the prediction, at 4 cameras x 1080p JPEG.

Runs `alpamayo alpasim-driver`'s service in this process on the demo checkpoint (the real model: its time is
what is subtracted) and drives it over loopback gRPC with the project's client. Per drive: the client's round
trip minus the time inside the predictor (`service_predict`, timed by the service around the model call), so
the figure is gRPC transport + session lookup + window assembly + ego-history interpolation + plan conversion
and serialisation. The per-frame JPEG decode happens when a frame is submitted, once per frame: it is timed
separately, per 4-camera tick. The first drive is warm-up and excluded.

    python benchmarks/alpasim_overhead.py [--drives 10] [--width 1920 --height 1080]
"""

from __future__ import annotations

import argparse
import io
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.spatial.transform import Rotation

from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.model_spec import ModelSpec
from alpamayo.runtime import AlpamayoVLA
from bridges.alpasim.client import AlpasimDriverClient, EgoDynamics, EgoPose
from bridges.alpasim.service import DEFAULT_CAMERAS, EgodriverService, serve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drives", type=int, default=10)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vla = AlpamayoVLA.from_spec(ModelSpec(checkpoint=make_demo_checkpoint(Path(tmp) / "ckpt", seed=0)))
        service = EgodriverService(vla, vla.model_line())
        server, port = serve(service, "127.0.0.1:0")
        client = AlpasimDriverClient(f"127.0.0.1:{port}")
        client.wait_ready()
        rng = np.random.default_rng(0)
        base = rng.integers(0, 256, (args.height // 8, args.width // 8, 3), dtype=np.uint8)
        jpegs = []
        for k in range(8):  # camera-like content (smooth, ~0.3 MB per 1080p frame), varied per frame
            im = Image.fromarray(np.roll(base, k, axis=1)).resize((args.width, args.height), Image.BILINEAR)
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=90)
            jpegs.append(buf.getvalue())
        q = Rotation.identity().as_quat()
        client.start_session("bench", DEFAULT_CAMERAS)
        submit_ms, overhead_ms, predict_ms = [], [], []
        poses = [
            EgoPose(t, (5.0 * t / 1e6, 0.0, 0.0), (q[3], q[0], q[1], q[2]))
            for t in range(0, 1_500_001, 100_000)
        ]
        client.submit_egomotion("bench", poses, [EgoDynamics((5.0, 0.0, 0.0))] * len(poses))
        t = 1_500_000
        for i in range(3 + args.drives + 1):
            t += 100_000
            p = EgoPose(t, (5.0 * t / 1e6, 0.0, 0.0), (q[3], q[0], q[1], q[2]))
            client.submit_egomotion("bench", [p], [EgoDynamics((5.0, 0.0, 0.0))])
            s0 = time.perf_counter()
            for cam in DEFAULT_CAMERAS:
                client.submit_image("bench", cam, jpegs[i % len(jpegs)], t - 33_000, t)
            submit_ms.append((time.perf_counter() - s0) * 1e3)
            if i < 3:
                continue
            d0 = time.perf_counter()
            resp = client.drive("bench", t, t)
            rtt = (time.perf_counter() - d0) * 1e3
            pm = pickle.loads(resp.debug_info.unstructured_debug_info)["timings_ms"]["service_predict"]
            if i > 3:
                overhead_ms.append(rtt - pm)
                predict_ms.append(pm)
        client.close()
        server.stop(0).wait()
        vla.close()
    print(
        f"4 x {args.width}x{args.height} JPEG ({np.mean([len(j) for j in jpegs]) / 1e6:.2f} MB each), {len(overhead_ms)} drives"
    )
    print(
        f"drive overhead beyond predict: median {np.median(overhead_ms):.2f} ms, max {np.max(overhead_ms):.2f} ms"
    )
    print(f"predict (demo checkpoint, CPU): median {np.median(predict_ms):.0f} ms")
    print(f"submit 4 frames (transport + JPEG decode), per tick: median {np.median(submit_ms):.1f} ms")


if __name__ == "__main__":
    main()
