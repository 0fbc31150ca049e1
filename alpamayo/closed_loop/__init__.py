"""Closed-loop runs over the synthetic world (`alpamayo closed-loop`): the ego drives the policy's plans.

* `alpamayo.closed_loop.driver`: the driver boundary (an AlpaSim egodriver session) and its gRPC adapter;
* `alpamayo.closed_loop.scene`: a scene (its seed), the ego's box and the timeline of a rollout;
* `alpamayo.closed_loop.controller`: pure pursuit and the kinematic bicycle that follow a plan at 10 Hz;
* `alpamayo.closed_loop.rollout`: one scene from the first frame to the last tick;
* `alpamayo.closed_loop.metrics`: AlpaSim's scorers (collision, off-road, progress, plan deviation, scene_score);
* `alpamayo.closed_loop.runner`: settings, `SceneRunner` (a Ray actor's body) and the run to RUN_DIR;
* `alpamayo.closed_loop.report`: the aggregate, report.json and one PNG per scene.
"""
