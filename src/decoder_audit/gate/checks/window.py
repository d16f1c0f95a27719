"""`window`: each layer attends exactly the span its declared sliding window allows, whatever the
window's size (DEFECTS.md #31: a window accepted by the config and dropped by one attention path,
huggingface/transformers#28980; or applied to a layer the config says is full).

The windows come from the model's own declaration (`ModelFacts.windows`: a DecoderConfig's
sliding_window and window_layers, a declared spec's, or a Hugging Face config's in any of its
forms: `references.hf_windows`). The span is read layer by layer, at the attention module
itself, so a window of 4096 positions is held against the module at T = 4098 and no
receptive field of stacked layers blurs it:

    one forward of two identical rows of T = W + 2 tokens (W the smallest declared window);
    at every layer's attention module, row 1's input is row 0's with position 0 replaced by a
    large random vector (a forward pre-hook), so each layer sees exactly one changed key;
    row 1's attention output against row 0's, position by position: a windowed layer's must
    move at 1..W-1 (inside: the change is read) and not at W.. (past the window: token 0 is out
    of reach); a full layer's must move everywhere.

The forward stops after the last attention module (the readout of T = W + 2 positions is never
computed). A window that is not shorter than the longest input the model takes never excludes
a token and is not checked (the registry skips it, saying so).
"""

from __future__ import annotations

import torch

from ..measure import value_scale
from ..result import CheckResult
from ..subject import Subject, get_attr

# The changed key is this many times the RMS of the attention input: its value (and, through
# q.k, its weight) then moves every output that reads it by order 1, far above rounding even
# where softmax spreads a query over thousands of keys.
KEY_GAIN = 64.0


class _Stop(Exception):
    """Raised after the last attention module ran: the rest of the forward is not needed."""


def _hidden(args: tuple, kwargs: dict, shape: tuple[int, int]) -> tuple[str, int | str] | None:
    """Where the attention module's input (B, T, D) is among its arguments."""
    for i, value in enumerate(args):
        if isinstance(value, torch.Tensor) and value.dim() == 3 and tuple(value.shape[:2]) == shape:
            return "arg", i
    for key in ("hidden_states", "x", "hidden_state", "input"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 3 and tuple(value.shape[:2]) == shape:
            return "kwarg", key
    return None


def _output(out) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _spans(s: Subject, seq_len: int
           ) -> tuple[list[tuple[torch.Tensor, float] | None], list[str]]:
    """Per attention layer, how far row 1's output moved from row 0's at each position (T,) and
    the scale of row 0's output, None where its output could not be read; and notes."""
    names = s.facts.attention_layers
    modules = [get_attr(s.work, name) for name in names]
    ids = s.random_ids(1, seq_len, s.generator(48)).to(s.device).repeat(2, 1)  # (2, T)
    key = torch.randn(1, generator=s.generator(49)).item()  # the sign of the change
    gen = s.generator(50)
    moved: list[tuple[torch.Tensor, float] | None] = [None] * len(modules)
    notes: list[str] = []

    def before(index):
        def hook(_module, args, kwargs):
            where = _hidden(args, kwargs, (2, seq_len))
            if where is None:
                notes.append(f"{names[index]}: no (B, T, D) input found")
                return None
            x = args[where[1]] if where[0] == "arg" else kwargs[where[1]]
            changed = x.clone()
            changed[1] = x[0]
            rms = x[0].float().pow(2).mean().sqrt().clamp(min=1e-6)
            noise = torch.randn(x.shape[-1], generator=gen).to(x.device, torch.float32)
            changed[1, 0] = (KEY_GAIN * rms * key * noise).to(x.dtype)
            if where[0] == "arg":
                return args[:where[1]] + (changed,) + args[where[1] + 1:], kwargs
            return args, {**kwargs, where[1]: changed}
        return hook

    def after(index):
        def hook(_module, _args, out):
            y = _output(out)
            if y is not None and y.dim() == 3 and y.shape[0] == 2:
                change = (y[1] - y[0]).detach().abs().amax(-1).float().cpu()  # (T,)
                moved[index] = (change, value_scale(y[0].detach()))
            if index == len(modules) - 1:
                raise _Stop
        return hook

    handles = [h for i, m in enumerate(modules)
               for h in (m.register_forward_pre_hook(before(i), with_kwargs=True),
                         m.register_forward_hook(after(i)))]
    try:
        with torch.no_grad():
            s.count(ids)
            s.call(ids)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return moved, notes


def check_window(s: Subject) -> CheckResult:
    windows, smallest = s.facts.windows, s.facts.window_size
    seq_len = min(smallest + 2, s.facts.length_bound or smallest + 2)
    moved, notes = _spans(s, seq_len)
    tol = s.shape_tolerance()
    records, problems = [], []
    for layer, (window, found) in enumerate(zip(windows, moved)):
        if found is None:
            records.append({"layer": layer, "declared": window, "read": None})
            problems.append(f"layer {layer}: its attention output could not be read")
            continue
        change, scale = found
        allowed = tol * scale
        read = [p for p in range(1, seq_len) if float(change[p]) > allowed]
        reach = seq_len if window is None else min(window, seq_len)
        expected = list(range(1, reach))
        records.append({"layer": layer, "declared": window, "allowed": allowed,
                        "farthest_read": max(read, default=0), "expected_farthest": reach - 1,
                        "unread_inside": [p for p in expected if p not in read][:8],
                        "read_outside": [p for p in read if p >= reach][:8]})
        problems += _layer_problems(records[-1], window)
    evidence = {"seq_len": seq_len, "windows": list(windows), "layers": records,
                "modules": list(s.facts.attention_layers), "key_gain": KEY_GAIN, "notes": notes}
    if problems:
        return CheckResult("window", False, problems[0] + (f" (and {len(problems) - 1} more)"
                                                           if len(problems) > 1 else ""),
                           evidence, tol)
    windowed = sum(w is not None for w in windows)
    return CheckResult("window", True, f"at T={seq_len}, each of {windowed} windowed layers reads "
                       f"token 0 exactly within its window of {smallest} positions and not past "
                       f"it; the {len(windows) - windowed} full layers (the config declares them "
                       "so) read it everywhere", evidence, tol)


def _layer_problems(record: dict, window: int | None) -> list[str]:
    layer, said = record["layer"], (f"a window of {window}" if window is not None
                                    else "full attention")
    out = []
    if record["read_outside"]:
        p = record["read_outside"][0]
        out.append(f"layer {layer} declares {said} but its position {p} reads token 0, "
                   f"{p} positions back: the window is not applied")
    if record["unread_inside"]:
        p = record["unread_inside"][0]
        out.append(f"layer {layer} declares {said} but its position {p} does not read token 0, "
                   f"{p} positions back: it attends a narrower span "
                   + ("(a window the config does not declare)" if window is None else ""))
    return out
