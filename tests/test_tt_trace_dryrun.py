"""The traced decode and expert paths under the dry run (marked `dryrun`), the production defaults that a card
alone would otherwise exercise: the trace bookkeeping (one capture per program, replays of it, release), the
persistent inputs rewritten in place before each replay, and `TraceSwitch`'s decision.

Trace capture crashes the dry run's mock p150, so `TraceRecorder` stands in for ttnn's four trace calls only:
`begin_trace_capture` hands out ids, `end_trace_capture` / `execute_trace` / `release_trace` are logged, and
every other call is the real ttnn's on the mock (the graph between begin and end runs eagerly there, as the
compile run does). The model is given the switch a card process builds (`TraceSwitch` without the dry run's
environment). What a replay computes is checked on a card (test_tt_text_device.py, test_tt_rows_device.py,
test_tt_expert_device.py: traced equals untraced bit for bit)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alpamayo.profiling import Tracer
from alpamayo.tt.device import MOCK_ENV
from alpamayo.tt.text.trace import DRY_RUN_NOTICE, DecodeTrace, TraceSwitch
from tests.tt_checkpoints import save_tt_checkpoint

pytestmark = pytest.mark.dryrun
MAX_SEQ_LEN = 256


class TraceRecorder:
    """The real ttnn module, its trace calls logged instead of run (see the module docstring); also logs which
    device tensor each host-to-device copy rewrites, with the host values."""

    def __init__(self, ttnn: Any) -> None:
        self._ttnn = ttnn
        self.calls: list[tuple[str, Any]] = []
        self.copies: list[tuple[Any, torch.Tensor]] = []
        self._next = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ttnn, name)

    def begin_trace_capture(self, device: Any, cq_id: int = 0) -> int:
        self._next += 1
        self.calls.append(("begin", self._next))
        return self._next

    def end_trace_capture(self, device: Any, trace_id: int, cq_id: int = 0) -> None:
        self.calls.append(("end", trace_id))

    def execute_trace(self, device: Any, trace_id: int, cq_id: int = 0, blocking: bool = True) -> None:
        self.calls.append(("execute", trace_id))

    def release_trace(self, device: Any, trace_id: int) -> None:
        self.calls.append(("release", trace_id))

    def copy_host_to_device_tensor(self, host: Any, device_tensor: Any, *args: Any) -> None:
        self.copies.append((device_tensor, self._ttnn.to_torch(host)))
        self._ttnn.copy_host_to_device_tensor(host, device_tensor, *args)

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


def card_switch(monkeypatch: pytest.MonkeyPatch) -> TraceSwitch:
    """The switch a process on a card builds: no mock cluster descriptor in its environment."""
    with monkeypatch.context() as m:
        m.delenv(MOCK_ENV, raising=False)
        return TraceSwitch()


def test_the_switch_keeps_traces_off_the_dry_run_and_says_so_once(monkeypatch, capsys):
    switch = TraceSwitch()  # this session runs under the dry run
    assert switch.notice == DRY_RUN_NOTICE
    assert [switch.traced(True), switch.traced(True), switch.traced(False)] == [False, False, False]
    assert capsys.readouterr().err.count(DRY_RUN_NOTICE) == 1
    card = card_switch(monkeypatch)
    assert card.notice is None
    assert [card.traced(True), card.traced(False)] == [True, False]
    assert capsys.readouterr().err == ""


def test_a_decode_trace_captures_once_replays_its_output_and_releases_it(dryrun_device):
    from alpamayo.tt.device import import_ttnn

    ttnn = import_ttnn()
    recorder = TraceRecorder(ttnn)
    trace = DecodeTrace(recorder, dryrun_device)
    assert not trace.captured
    host = torch.arange(32 * 32, dtype=torch.float32).view(1, 1, 32, 32)
    outs = []

    def graph() -> Any:
        outs.append(ttnn.from_torch(host, layout=ttnn.TILE_LAYOUT, device=dryrun_device))
        return outs[-1]

    trace.capture(graph)
    assert trace.captured and trace.trace_id == 1 and len(outs) == 1 and trace.out is outs[0]
    assert trace.replay() is outs[0] and trace.replay() is outs[0]  # replays rewrite the captured output
    assert recorder.kinds() == ["begin", "end", "execute", "execute"]
    trace.release()
    assert recorder.calls[-1] == ("release", 1) and not trace.captured and trace.out is None
    trace.release()  # a second release frees nothing twice
    assert recorder.kinds().count("release") == 1


@pytest.fixture
def traced_text(dryrun_device, tmp_path, monkeypatch):
    """A tiny `TTTextModel` (GQA 2:1) on the mock whose trace calls `TraceRecorder` logs, switched as on a card."""
    from alpamayo.tt.text import TTTextModel

    save_tt_checkpoint(tmp_path, "gqa2", seed=3)
    tt = TTTextModel.from_checkpoint(tmp_path, precision="performance", device=dryrun_device)
    recorder = TraceRecorder(tt.ttnn)
    tt.kernels.ttnn, tt.decoder.trace_switch, tt.tracer = (
        recorder,
        card_switch(monkeypatch),
        Tracer(enabled=True),
    )
    yield tt, recorder
    tt.close()


def test_decode_captures_one_trace_per_program_and_replays_it_over_rewritten_inputs(traced_text):
    tt, recorder = traced_text
    tt.setup_cache(MAX_SEQ_LEN)
    prompt = torch.arange(40) % 200
    tt.prefill(prompt)
    spans = len(tt.tracer.spans)
    tt.decode(7)  # compile, then capture
    assert recorder.kinds() == ["begin", "end"] and len(tt.decoder.traces) == 1
    ((key, first),) = tt.decoder.traces.items()
    inputs = tt.decoder.persistent[key[0]]
    copies = len(recorder.copies)
    tt.decode(9)
    tt.decode(11)
    assert recorder.kinds() == ["begin", "end", "execute", "execute"]
    assert [c[1] for c in recorder.calls[2:]] == [first.trace_id] * 2 and len(tt.decoder.traces) == 1
    names = [s.name for s in tt.tracer.spans[spans:] if s.name.startswith("tt.decode")]
    assert names == ["tt.decode_compile_and_capture", "tt.decode_trace_execute", "tt.decode_trace_execute"]
    # before each replay the captured program's own input tensors were rewritten with the new row
    rewritten = recorder.copies[copies:]
    assert {id(d) for d, _ in rewritten} == {id(t) for t in inputs.tensors()}
    positions = [int(v.flatten()[0]) for d, v in rewritten if d is inputs.pos]
    assert positions == [41, 42]  # the prompt's 40 rows, then 7 at 40: 9 at 41, 11 at 42
    embeds = [v for d, v in rewritten if d is inputs.x]
    hidden = tt.text_cfg.hidden_size
    for token, x in zip((9, 11), embeds, strict=True):
        assert torch.equal(x[0, 0, 0, :hidden].float(), tt.head.embed_table[token].float())
    assert tt.cache_len == 43
    # a new cache releases the traces bound to the old one's buffers; three rows are another program
    tt.setup_cache(MAX_SEQ_LEN, max_batch=3)
    assert recorder.calls[4:] == [("release", 1)] and tt.decoder.traces == {}
    tt.prefill(prompt)
    tt.fork(3)
    tt.decode(torch.tensor([1, 2, 3]))
    tt.decode(torch.tensor([4, 5, 6]))
    assert recorder.calls[5:] == [("begin", 2), ("end", 2), ("execute", 2)]
    assert [t.trace_id for t in tt.decoder.traces.values()] == [2]
    tt.close()
    assert recorder.calls[-1] == ("release", 2)


def test_the_expert_step_is_captured_once_and_replayed_for_every_later_step(
    dryrun_device, tmp_path, monkeypatch
):
    """Step 0 compiles and captures the Euler step, steps 1..N-1 replay it; the
    next prediction replays all N over the noise rewritten into the same x; a new step count is a new state
    and trace, the old one released."""
    from alpamayo.tt.expert import TTActionExpert
    from tests.test_tt_expert_dryrun import filled, weightless_text
    from tests.tt_checkpoints import TT_TINY, tiny_config
    from tests.tt_expert_cases import TINY_VLM, save_expert_weights, tiny_expert

    text = weightless_text(dryrun_device, tiny_config(TT_TINY[TINY_VLM], TINY_VLM), "performance")
    expert = TTActionExpert.from_checkpoint(save_expert_weights(tmp_path, tiny_expert()), text, tiny_expert())
    try:
        recorder = TraceRecorder(expert.ttnn)
        expert.ttnn, text.decoder.trace_switch, expert.tracer = (
            recorder,
            card_switch(monkeypatch),
            Tracer(enabled=True),
        )
        filled(text, 2)
        noise = torch.randn(2, 64, 2, generator=torch.Generator().manual_seed(0))
        expert.sample(noise, [300, 310], rope_delta=-40, steps=4)
        assert recorder.calls == [("begin", 1), ("end", 1), ("execute", 1), ("execute", 1), ("execute", 1)]
        steps = [s for s in expert.tracer.spans if s.name == "expert_step"]
        assert [(s.args["step"], s.args["traced"]) for s in steps] == [(k, True) for k in range(4)]
        x = expert._state.buffers.x
        writes = [v for d, v in recorder.copies if d is x]
        assert len(writes) == 1 and torch.equal(writes[0][0, 0, :128, :2], noise.reshape(-1, 2))
        expert.sample(2 * noise, [300, 310], rope_delta=-40, steps=4)
        assert recorder.calls[5:] == [("execute", 1)] * 4 and expert._state.buffers.x is x
        writes = [v for d, v in recorder.copies if d is x]
        assert len(writes) == 2 and torch.equal(writes[1][0, 0, :128, :2], 2 * noise.reshape(-1, 2))
        expert.sample(noise, [300, 310], rope_delta=-40, steps=3)  # another schedule: another trace
        assert recorder.calls[9:] == [
            ("release", 1),
            ("begin", 2),
            ("end", 2),
            ("execute", 2),
            ("execute", 2),
        ]
    finally:
        expert.close()
        text.close()
    assert recorder.calls[-1] == ("release", 2)
