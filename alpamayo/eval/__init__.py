"""Open-loop evaluation of a model over many clips (`alpamayo eval`), in-process or on Ray.

* `alpamayo.eval.clips`: the clips (drive paths, clip lists), their ids and per-clip seeds;
* `alpamayo.eval.settings`: `EvalSettings`, what an evaluation asks for;
* `alpamayo.eval.evaluator`: `ClipEvaluator`, one model answering one clip at a time (a Ray actor's body);
* `alpamayo.eval.ray_workers`: placement of the evaluators on Ray, dispatch and retries;
* `alpamayo.eval.results`: RUN_DIR: atomic per-clip JSON results, resume, clips.parquet;
* `alpamayo.eval.report`, `alpamayo.eval.plots`: the aggregate (NVIDIA's minADE_K), report.json and PNGs;
* `alpamayo.eval.session`: one evaluation from settings to RUN_DIR.
"""
