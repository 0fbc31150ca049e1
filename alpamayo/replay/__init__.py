"""Replay of recorded drives through the model, lock-step or real-time, with accuracy and latency reports.

* `alpamayo.replay.ticks`: model inputs per 10 Hz tick from any recorded drive (`bridges.drives`), and its
  recorded future;
* `alpamayo.replay.routes`: the navigation text of each tick (`--route TEXT | auto`, `--route-file`);
* `alpamayo.replay.extract`: one tick as `predict`'s files (`alpamayo extract`);
* `alpamayo.replay.settings`: `ReplaySettings` (what a replay asks for) and `ReplayJob` (what a mode runs);
* `alpamayo.replay.lockstep`, `alpamayo.replay.realtime`: the two replay modes (`ReplayJob` -> `ReplayRun`);
* `alpamayo.replay.results`: `TickResult` and `ReplayRun`, one result form for both modes;
* `alpamayo.replay.outputs`: predictions as MCAP topics Foxglove opens;
* `alpamayo.replay.ros2_outputs`: the same as a rosbag2 file (`--format ros2`: Autoware Trajectory, Path, String);
* `alpamayo.replay.accuracy`: ADE/FDE/minADE per horizon against the recorded future, validity;
* `alpamayo.replay.report`: the latency table, decode speed, JSON report, Chrome trace and plots;
* `alpamayo.replay.session`: one replay from settings (`alpamayo replay`, `profile`, `demo`).
"""
