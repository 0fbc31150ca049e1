"""Trajectory side of the driving model: ego history in the t0 frame, trajectory tokenizers, the unicycle
action space and rollout, the Alpamayo prompt, route waypoints -> navigation text, and planning metrics.
Host-side numpy (float64) throughout."""
