"""Trajectory side of the driving model: ego history in the t0 frame, trajectory tokenizers, the unicycle
action space and rollout, the Alpamayo prompt, route waypoints -> navigation text, planning metrics, and the
plan types the decoding yields (`plans`). Host-side numpy (float64) throughout."""
