"""Notebook 03, exercise 2: the `Attention` forward pass, fed blocks.{i}.ln1.hook_out and compared
with blocks.{i}.hook_attn_out, then on inputs no file holds; when it is wrong, the scores it passed
to apply_causal_mask and its heads one at a time say where the difference starts."""
import math

import einops
import torch

from graders.exercises.nb03.common import (DIMS, FORBIDDEN, MASK_FIX, PER_HEAD_POSITIONS, SCORE_DIMS, activations,
                                           attention_weights, course_attention, prefix_of, reference_scores)
from graders.exercises.nb03.mask import missing_mask_method
from graders.exercises.nb03.mistakes import MASKS_THE_DIAGONAL, attention_mistakes, head_settings_not_read
from graders.exercises.common.diagnosis import crash, is_crash
from graders.judging.compare import LIKELY, CheckFailed, Mistake, check_shape, compare, mistake_key, with_fix
from graders.judging.rendering import split_fix
from graders.judging.cases import Case, rand_float, unseen_variant
from graders.judging.exercise import Exercise
from graders.judging.learner import build_loaded, reads_global, run_learner
from graders.judging.tolerance import close, tolerance
from graders.reference.config import Config
from graders.reference.store import part
from graders.reference.weights import load_strict


def _causal_split(seq: int) -> int:
    return max(1, seq // 2)


def _other_input(case: Case, x: torch.Tensor, seed_offset: int, rows: int, positions: int) -> torch.Tensor:
    return rand_float(case.seed * 1000 + seed_offset, rows, positions, x.shape[-1]) * x.std()


def inputs_attention(case: Case) -> dict:
    return {"x": activations(case)[f"blocks.{case.block}.ln1.hook_out"]}


def _course_mask(attn_scores: torch.Tensor) -> torch.Tensor:
    """The course's causal mask, applied in place as well as returned (as the widely copied
    masked_fill_ solutions do), so a forward that ignores the result still gets its scores masked."""
    q_len, k_len = attn_scores.shape[-2:]
    future = torch.triu(torch.ones(q_len, k_len, dtype=torch.bool, device=attn_scores.device), diagonal=1)
    try:
        return attn_scores.masked_fill_(future, float("-inf"))
    except RuntimeError:   # e.g. an expanded tensor, which cannot be written in place
        return attn_scores.masked_fill(future, float("-inf"))


def produce_attention(Attention, case: Case, inputs: dict) -> dict:
    """The learner's forward runs with the course's mask in place of their apply_causal_mask, which
    has a check of its own: a mistake in the mask costs that check only, never the forward's."""
    cfg, weights = case.config(), attention_weights(case)
    attn = build_loaded("Attention", Attention, cfg, weights)
    x = inputs["x"].clone()   # the learner's own copy
    x_before = x.clone()
    seen = []

    def recording(attn_scores, *args, **kwargs):
        if isinstance(attn_scores, torch.Tensor):
            seen.append(attn_scores.detach().clone())
        return _course_mask(attn_scores)

    has_mask = getattr(attn, "apply_causal_mask", None) is not None
    if has_mask:
        attn.apply_causal_mask = recording  # instance attribute: records the scores forward passes it
    try:
        out = run_learner("Attention", attn, x, forbidden=FORBIDDEN)
    except CheckFailed as failure:
        missing = missing_mask_method(attn)
        if missing and "apply_causal_mask" in str(failure):
            raise CheckFailed(missing + " (Your forward calls self.apply_causal_mask.)",
                              mistake=mistake_key(missing)) from failure.__cause__
        if case.settings() and is_crash(failure):
            raise crash("Attention", failure, f"this check's config ({cfg.n_heads} heads of {cfg.d_head}, "
                        f"d_model {cfg.d_model})", Mistake("head_settings_hard_coded", "n_heads or d_head is "
                                                           "hard-coded (GPT-2's 12 or 64) instead of read from "
                                                           "self.cfg")) from failure.__cause__
        raise
    if has_mask:    # the later runs need the course's mask, not another record of their scores
        attn.apply_causal_mask = lambda attn_scores, *args, **kwargs: _course_mask(attn_scores)
    outputs = {
        "random_out": run_learner("Attention", attn, rand_float(case.seed, 2, 4, Config().d_model),
                                  forbidden=FORBIDDEN),
        "out": out,
        "input_modified": torch.tensor(not torch.equal(x, x_before)),
        "unseen_out": run_learner("Attention", attn, unseen_variant(x, case.seed), forbidden=FORBIDDEN),
        "mask_calls": torch.tensor(len(seen)),
        "scores_seen": seen[0] if seen else torch.zeros(0),
        "reads_global_cfg": torch.tensor(reads_global(Attention, "cfg")),
    }
    # Causality: replace every position >= t; outputs before t must not move.
    t = _causal_split(x.shape[1])
    changed = x.clone()
    changed[:, t:] = _other_input(case, x, 1, x.shape[0], x.shape[1] - t)
    outputs["changed_later_out"] = run_learner("Attention", attn, changed, forbidden=FORBIDDEN)
    # Batch independence: [this input, another one] together vs each alone.
    other = _other_input(case, x, 2, 1, x.shape[1])
    outputs["other_alone_out"] = run_learner("Attention", attn, other, forbidden=FORBIDDEN)
    outputs["pair_out"] = run_learner("Attention", attn, torch.cat([x[:1], other]), forbidden=FORBIDDEN)
    # One head at a time (W_O of the other heads and b_O zeroed), to say which heads are wrong;
    # on the first row and first positions only, to keep it cheap (attention is causal).
    head_input = x[:1, :PER_HEAD_POSITIONS].clone()
    per_head = []
    for h in range(weights["W_O"].shape[0]):
        only = dict(weights)
        only["W_O"] = torch.zeros_like(weights["W_O"])
        only["W_O"][h] = weights["W_O"][h]
        only["b_O"] = torch.zeros_like(weights["b_O"])
        load_strict(attn, only, "Attention")
        per_head.append(run_learner("Attention", attn, head_input, forbidden=FORBIDDEN))
    outputs["per_head_out"] = torch.stack(per_head) if all(
        isinstance(p, torch.Tensor) and p.shape == head_input.shape for p in per_head) else torch.zeros(0)
    return outputs


def _indented(failure: CheckFailed) -> list[str]:
    return ["    " + line for line in str(failure).splitlines()]


def _localise(case: Case, outputs: dict) -> tuple[list[str], str | None]:
    """Where inside the learner's forward the difference starts, from what produce recorded (on
    GPT-2's own head settings: it reads the reference's queries, keys and z), and the key of the
    mistake those lines name (None when they name none)."""
    if case.settings():
        return [], None
    prefix, lines, cfg, key = prefix_of(case), [], Config(), None
    acts, w = activations(case), part(prefix)
    scores = reference_scores(case)
    if int(outputs["mask_calls"]) == 0:
        lines.append("  Your forward never called self.apply_causal_mask: mask the scores with it "
                     "before the softmax.")
    else:
        seen = outputs["scores_seen"]
        x = acts[f"blocks.{case.block}.ln1.hook_out"]
        try:
            compare("The scores your forward passed to apply_causal_mask", seen, scores, SCORE_DIMS,
                    mistakes={
                        Mistake("scaled_by_d_model", "scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)"):
                            scores * math.sqrt(cfg.d_head / cfg.d_model),
                        Mistake("not_scaled", "not scaled by 1/sqrt(d_head)"): scores * math.sqrt(cfg.d_head),
                        Mistake("divided_by_d_head", "divided by d_head instead of sqrt(d_head)"):
                            scores / math.sqrt(cfg.d_head),
                        Mistake("mask_after_softmax", "these are already probabilities: the softmax was taken "
                                "before the mask"):
                            scores.softmax(-1),
                        Mistake("no_b_q", "b_Q missing from the queries"): _scores_without(x, w, "b_Q"),
                    })
            lines.append("  The scores your forward passed to apply_causal_mask are right, so the "
                         "difference comes later: the mask, the softmax, z, W_O or b_O.")
        except CheckFailed as failed:
            lines.append("  The difference starts before the mask:")
            lines += _indented(failed)
            key = failed.mistake
    per_head = outputs["per_head_out"]
    n_heads = w["W_O"].shape[0]
    if per_head.shape[:1] == (n_heads,):
        z = acts[f"blocks.{case.block}.attn.hook_z"]
        z = z[:1, :per_head.shape[2]]
        wrong = [h for h in range(n_heads)
                 if not close(per_head[h], einops.einsum(z[:, :, h], w["W_O"][h], "b p h, h d -> b p d"))]
        if not wrong:
            lines.append("  With W_O and b_O kept to one head at a time, every head's contribution is "
                         "right: look at what you add after summing the heads (b_O).")
        elif len(wrong) < n_heads:
            key = key or "some_heads_wrong"
            lines.append(f"  Likely mistake: heads whose own contribution (z[:, :, h] @ W_O[h]) is wrong: "
                         f"{', '.join(map(str, wrong))} (the others are right); look for a head "
                         "dropped, or indexed wrongly, when the heads are split or summed.")
        else:
            lines.append("  Every head's own contribution (z[:, :, h] @ W_O[h]) is wrong.")
    return lines, key


def _scores_without(x, w, bias: str) -> torch.Tensor:
    zero = {k: (torch.zeros_like(v) if k == bias else v) for k, v in w.items()}
    q = einops.einsum(x, zero["W_Q"], "b p d, n d h -> b p n h") + zero["b_Q"]
    k = einops.einsum(x, zero["W_K"], "b p d, n d h -> b p n h") + zero["b_K"]
    return einops.einsum(q, k, "b q n h, b k n h -> b n q k") / math.sqrt(q.shape[-1])


def judge_attention(case: Case, outputs: dict) -> None:
    """GPT-2's own outputs from the files; a case with other head settings is judged against the
    course's Attention built with them (GPT-2's weights regrouped into its heads)."""
    prefix, settings = prefix_of(case), case.settings()
    d_model = Config().d_model
    check_shape("Attention output on a random [2, 4, d_model] input", outputs["random_out"],
                (2, 4, d_model), DIMS)
    if bool(outputs["input_modified"]):
        raise CheckFailed("Attention changed its input tensor in place. Compute new tensors instead: "
                          "the residual stream must not be modified by reading it.",
                          mistake="modifies_input_in_place")
    acts, w = activations(case), attention_weights(case)
    x = acts[f"blocks.{case.block}.ln1.hook_out"]
    course = course_attention(case)
    with torch.no_grad():
        expected = course(x) if settings else acts[f"blocks.{case.block}.hook_attn_out"]
    out = outputs["out"]
    check_shape(f"Attention output ({prefix})", out, expected.shape, DIMS)
    seen = outputs["scores_seen"]
    if not settings and seen.shape == x.shape[:1] + (w["W_Q"].shape[0], x.shape[1], x.shape[1]) and not (
            out.is_floating_point() and close(out, expected)) and close(seen, reference_scores(case).softmax(-1)):
        raise CheckFailed(
            f"Attention output ({prefix}) is wrong. Likely mistake: the causal mask is applied after "
            "the softmax: your forward passes probabilities (rows summing to 1) to "
            "self.apply_causal_mask. Mask the SCORES first, then take the softmax, so that each "
            "query's weights sum to 1 over the keys it may see.", mistake="mask_after_softmax")
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).any(dim=0).any(dim=-1).nonzero().flatten().tolist()
        lines = [f"Attention output ({prefix}) has NaN or infinite values at positions "
                 f"{', '.join(map(str, bad[:10]))}."]
        key = None
        if bad == [0]:
            key = "masks_diagonal"
            lines.append("  Likely mistake: the mask hides the diagonal too, so the first token has no "
                         "key left and softmax over all -inf gives NaN. A token may attend to itself: "
                         "mask only the keys after the query.")
        elif bad == [x.shape[1] - 1]:
            key = "masks_past_and_diagonal"
            lines.append("  Likely mistake: the mask hides the past and the diagonal (tril instead of "
                         "triu), so the last token has no key left. Rows are queries, columns keys: "
                         "the future is above the diagonal.")
        else:
            lines.append("  A row of scores that is entirely -inf gives NaN after softmax; look for a "
                         "mask that hides every key of some query, or a division by zero.")
        where, where_key = _localise(case, outputs)
        raise CheckFailed(with_fix("\n".join(lines + where), MASK_FIX if bad == [0] else ""),
                          mistake=key or where_key)
    global_cfg = bool(outputs.get("reads_global_cfg", False))

    def mistakes(inp: torch.Tensor) -> dict:
        return {**head_settings_not_read(case, inp, w, global_cfg), **attention_mistakes(inp, w)}

    try:
        compare(f"Attention output ({prefix})", out, expected, DIMS, mistakes=lambda: mistakes(x),
                fixes={MASKS_THE_DIAGONAL: MASK_FIX})
    except CheckFailed as failed:
        shown, fix = split_fix(str(failed))
        where, where_key = _localise(case, outputs)
        if not where and LIKELY not in shown:   # nothing more precise known: a pointer to the steps
            where = ["  Hint: follow the notebook's steps of one head (queries, keys, values; scores "
                     "scaled by sqrt(d_head); the causal mask; a softmax over keys; the weighted values; "
                     "W_O), the heads' outputs summed."]
        raise CheckFailed(with_fix("\n".join([shown] + where), fix or ""),
                          mistake=failed.mistake or where_key) from None
    t = _causal_split(x.shape[1])
    later = outputs["changed_later_out"]
    check_shape("Attention output with later positions changed", later, expected.shape, DIMS)
    moved = ((later[:, :t].double() - out[:, :t].double()).abs() > tolerance(out[:, :t])).any(dim=0).any(dim=-1)
    if bool(moved.any()):
        raise CheckFailed(
            f"Attention is not causal: replacing the input at positions >= {t} changed your output at "
            f"earlier positions {', '.join(map(str, moved.nonzero().flatten().tolist()[:10]))}. A query "
            "must only read its own and earlier keys: mask every key after the query.")
    pair, alone = outputs["pair_out"], outputs["other_alone_out"]
    check_shape("Attention output on a batch of 2", pair, (2, x.shape[1], d_model), DIMS)
    for row, single, name in ((0, out[:1], "the graded input"), (1, alone, "another input")):
        if not close(pair[row:row + 1], single):
            raise CheckFailed(
                f"Attention mixes the batch: on a batch of two different inputs, row {row} ({name}) "
                "differs from running it alone. Keep the batch axis separate in every einsum/matmul "
                "(no sum over batch, no reshape that merges batch with positions or heads).")
    # Inputs no file holds: the expected outputs are computed here, with the course's Attention.
    for key, what, inp in (("random_out", "a random [2, 4, d_model] input", rand_float(case.seed, 2, 4, d_model)),
                           ("unseen_out", "a rescaled, noisy input that no file holds", unseen_variant(x, case.seed))):
        with torch.no_grad():
            expected = course(inp)
        compare(f"Attention output ({prefix}) on {what}", outputs[key], expected, DIMS,
                mistakes=lambda: mistakes(inp))


attention = Exercise("03_attention", "Attention", produce_attention, judge_attention,
                      inputs=inputs_attention, forbidden=(FORBIDDEN,))
check_attention = attention.checker(
    "Grade the learner's `Attention` forward pass (visible check: block 0, reference text).")
