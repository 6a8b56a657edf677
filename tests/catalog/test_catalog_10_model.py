"""Notebook 10's decoder layer, model and generation graders (graders/exercises/nb10/model.py): correct
variants (in other styles) pass, each catalogued mistake fails with its name, and the course's decoder
agrees with transformers' LlamaForCausalLM."""
import math

import pytest
import torch
from torch import nn

from graders.exercises import nb10
from graders.exercises.nb10 import reference as ref
from graders.judging.tolerance import close
from course_code import course_code_allowed
from catalog_helpers import fails_with
from test_catalog_10_attention import _attention
from test_catalog_10_norm_mlp import _mlp


# The variants are built on the course's reference decoder (a subclass with one method changed).
reference_code_allowed = course_code_allowed(ref)


def test_the_course_decoder_matches_llama_whole_and_cached():
    from graders.exercises.nb10.norm_mlp import hf_model, weights

    for n_kv in (2, 1, 8):
        cfg = nb10.ModernConfig(n_kv_heads=n_kv)
        model = ref.ModernDecoder(cfg)
        model.load_state_dict(weights(3, n_kv))
        tokens = torch.randint(0, cfg.d_vocab, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = hf_model(3, n_kv)(tokens).logits
            first, past = model(tokens[:, :4])
            second, _ = model(tokens[:, 4:], past)
        assert close(torch.cat([first, second], 1), expected, depth=cfg.n_layers + 1)


# --- The decoder layer, the model, generation ----------------------------------------------------

def _layer(kind):
    class DecoderLayer(ref.DecoderLayer):
        def forward(self, x, cos, sin, past=None):
            if kind == "post":
                mid = self.ln1(x + self.attn(x, cos, sin, past)[0])
                return self.ln2(mid + self.mlp(mid)), None
            if kind == "parallel":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + self.mlp(self.ln2(x)), cache
            if kind == "drops_past":
                out, cache = self.attn(self.ln1(x), cos, sin)
                x = x + out
                return x + self.mlp(self.ln2(x)), cache
            if kind == "old_past":
                x = x + self.attn(self.ln1(x), cos, sin, past)[0]
                return x + self.mlp(self.ln2(x)), past
            if kind == "queries_cached":
                x_in = self.ln1(x)
                out, (keys, values) = self.attn(x_in, cos, sin, past)
                x = x + out
                return x + self.mlp(self.ln2(x)), (keys * 2, values)
            if kind == "ln1_twice":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + self.mlp(self.ln1(x + out)), cache
            if kind == "no_mlp_residual":
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return self.mlp(self.ln2(x + out)), cache
            if kind == "half_mlp":      # nobody's catalog: named by its place
                out, cache = self.attn(self.ln1(x), cos, sin, past)
                return x + out + 0.5 * self.mlp(self.ln2(x + out)), cache
            if kind == "attn_on_mlp_input":   # nobody's catalog: the MLP first, then attention
                m = x + self.mlp(self.ln2(x))
                out, cache = self.attn(self.ln1(m), cos, sin, past)
                return m + out, cache
            if kind in ("attn_twice", "mlp_twice"):   # held-out mistake; the MLP's invented here
                for _ in range(2 if kind == "attn_twice" else 1):
                    out, cache = self.attn(self.ln1(x), cos, sin, past)
                    x = x + out
                for _ in range(2 if kind == "mlp_twice" else 1):
                    x = x + self.mlp(self.ln2(x))
                return x, cache
            out, cache = self.attn(self.ln1(x), cos, sin, past)
            return out + self.mlp(self.ln2(out)), cache
    return DecoderLayer


def test_decoder_layer_passes_and_its_mistakes_are_named():
    nb10.check_decoder_layer(ref.DecoderLayer)
    nb10.check_decoder_layer(ref.DecoderLayer, seed=2, batch=1, seq=17, block=3)
    fails_with(nb10.check_decoder_layer, _layer("post"), expected="Likely mistake: post-norm")
    fails_with(nb10.check_decoder_layer, _layer("parallel"), expected="Likely mistake: attention and the MLP both read")
    fails_with(nb10.check_decoder_layer, _layer("no_residual"), expected="Likely mistake: the residual is not added")
    fails_with(nb10.check_decoder_layer, _layer("drops_past"),
               expected="Likely mistake: `past` is not passed on to the attention")
    fails_with(nb10.check_decoder_layer, _layer("ln1_twice"),
               expected="Likely mistake: ln1 is used before the MLP too, where ln2 belongs")
    fails_with(nb10.check_decoder_layer, _layer("no_mlp_residual"),
               expected="Likely mistake: the residual is not added around the MLP")
    fails_with(nb10.check_decoder_layer, _layer("half_mlp"),
               expected="Likely mistake: the layer's output is 1·(x + attn_out) + 0.5·mlp_out")
    fails_with(nb10.check_decoder_layer, _layer("attn_twice"),
               expected="Likely mistake: attention is applied twice (self.attn called 2x): the second time on "
                        "ln1(x + attn_out), the step x = x + attn(ln1(x)) written twice")
    fails_with(nb10.check_decoder_layer, _layer("mlp_twice"),
               expected="Likely mistake: the MLP is applied twice (self.mlp called 2x)")
    fails_with(nb10.check_decoder_layer, _layer("attn_on_mlp_input"),
               expected="ln1's output (Llama's input_layernorm), the first activation in forward order")
    # The cache it returns: the old `past`, or other tensors than the attention's cache.
    fails_with(nb10.check_decoder_layer, _layer("old_past"),
               expected="Likely mistake: the `past` passed in is returned instead of the cache your attention")
    fails_with(nb10.check_decoder_layer, _layer("queries_cached"), expected="cached keys")


class RestartingPositions(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        cos, sin = ref.rope_cos_sin(torch.arange(tokens.shape[1]), self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache


class NoFinalNorm(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = 0 if past is None else past[0][0].shape[2]
        cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head, self.cfg.rope_theta)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return x @ self.W_U, cache


def _model(kind):
    """A model with one mistake in what it hands its layers (unlisted classes)."""
    class ModernDecoder(ref.ModernDecoder):
        def forward(self, tokens, past=None):
            start = 0 if past is None else past[0][0].shape[2]
            cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head,
                                        self.cfg.rope_theta)
            if kind == "swapped":
                cos, sin = sin, cos
            x, cache = self.W_E[tokens] * (math.sqrt(self.cfg.d_model) if kind == "scaled" else 1), []
            for i, block in enumerate(self.blocks):
                layer_past = None if past is None else past[0 if kind == "layer0_cache" else i]
                y, layer_cache = block(x, cos, sin, layer_past)
                x = x if kind == "skip_last" and i == len(self.blocks) - 1 else y
                cache.append(layer_cache)
            return self.ln_final(x) @ (self.W_E.T if kind == "tied" else self.W_U), cache
    return ModernDecoder


@pytest.mark.parametrize("kind, expected", [
    ("scaled", "the first place in forward order that differs from LlamaForCausalLM's is the embedding (what "
               "blocks[0] reads). Likely mistake: the embedding is multiplied by 16"),
    ("swapped", "the first place in forward order that differs from LlamaForCausalLM's is the cos and sin given "
                "to blocks[0]. Likely mistake: cos and sin are swapped"),
    ("tied", "Likely mistake: the unembedding is tied to W_E"),
    ("layer0_cache", "the first place in forward order that differs from LlamaForCausalLM's from position 6 on (the "
                     "chunk that runs on the cache) is the cache given to blocks[1]. Likely mistake: blocks[1] is "
                     "given layer 0's cache: every layer gets layer 0's"),
    ("skip_last", "is the final norm's input. Likely mistake: it is blocks[2]'s output: the final norm reads the "
                  "last layer's output"),
])
def test_model_mistakes_nobody_listed_are_named_by_place(kind, expected):
    fails_with(nb10.check_modern_decoder, _model(kind), expected=expected)


def test_model_in_another_correct_style_passes():
    nb10.check_modern_decoder(_model("right"))


def test_a_part_with_a_check_of_its_own_costs_only_that_check():
    """One mistake, one exercise: a layer built on a wrong attention, norm or MLP passes the layer's
    check, and a model built on wrong layers or a wrong final norm passes the model's; the parts'
    own checks fail them."""
    Attention = _attention(groups="repeat")
    Norm = type("RMSNorm", (ref.RMSNorm,), {"forward": lambda self, x: x * self.w})

    class WrongParts(ref.DecoderLayer):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.attn, self.ln1, self.mlp = Attention(cfg), Norm(cfg), _mlp("gelu")(cfg)

    class WrongLayers(ref.ModernDecoder):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList([_layer("post")(cfg) for _ in range(cfg.n_layers)])
            self.ln_final = Norm(cfg)

    nb10.check_decoder_layer(WrongParts)
    nb10.check_modern_decoder(WrongLayers)
    fails_with(nb10.check_gq_attention, Attention, expected="`repeat` where `repeat_interleave` is needed")
    fails_with(nb10.check_decoder_layer, _layer("post"), expected="Likely mistake: post-norm")


class ThetaWrittenIn(ref.ModernDecoder):
    def forward(self, tokens, past=None):
        start = 0 if past is None else past[0][0].shape[2]
        cos, sin = ref.rope_cos_sin(torch.arange(start, start + tokens.shape[1]), self.cfg.d_head, 10000.0)
        x, cache = self.W_E[tokens], []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, cos, sin, None if past is None else past[i])
            cache.append(layer_cache)
        return self.ln_final(x) @ self.W_U, cache


def test_model_passes_and_its_mistakes_are_named():
    nb10.check_modern_decoder(ref.ModernDecoder)
    nb10.check_modern_decoder(ref.ModernDecoder, seed=6, batch=1, seq=20, rope_theta=500000.0)
    nb10.check_modern_decoder(ThetaWrittenIn)
    fails_with(nb10.check_modern_decoder, ThetaWrittenIn, rope_theta=500000.0,
               expected="Likely mistake: rope_theta is not read from the config")
    fails_with(nb10.check_modern_decoder, RestartingPositions, expected="Likely mistake: positions restart at 0")
    fails_with(nb10.check_modern_decoder, NoFinalNorm, expected="Likely mistake: the final RMSNorm is missing")


def _generate(cache=True):
    def generate_greedy(model, tokens, n_new):
        logits, past = model(tokens)
        for step in range(n_new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, token], dim=1)
            if step < n_new - 1:
                logits, past = model(token, past) if cache else model(tokens)
        return tokens
    return generate_greedy


def _append_then_call(pick=lambda logits: logits[:, -1].argmax(-1, keepdim=True), keep_cache=True):
    """The usual loop: append the chosen token, then call the model, once more after the last."""
    def generate_greedy(model, tokens, n_new):
        logits, past = model(tokens)
        for _ in range(n_new):
            token = pick(logits)
            tokens = torch.cat([tokens, token], dim=1)
            logits, new_past = model(token, past)
            past = new_past if keep_cache else None
        return tokens
    return generate_greedy


def _whole_sequence_with_the_cache(model, tokens, n_new):
    logits, past = model(tokens)
    for _ in range(n_new):
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        logits, past = model(tokens, past)
    return tokens


def test_generate_greedy_with_a_call_after_the_last_token_passes():
    nb10.check_generate_greedy(_append_then_call())
    nb10.check_generate_greedy(_append_then_call(), seed=3, batch=3, seq=4)


@pytest.mark.parametrize("learner, expected", [
    (_append_then_call(lambda logits: logits[:, 0].argmax(-1, keepdim=True)),
     "Likely mistake: the next token is read from the first position's logits"),
    (_append_then_call(lambda logits: logits[:, -1].argmin(-1, keepdim=True)),
     "Likely mistake: the least likely token is taken"),
    (_append_then_call(keep_cache=False), "Likely mistake: the cache is fed wrongly"),
    (_whole_sequence_with_the_cache, "Likely mistake: call 2 fed 6 tokens with a cache of 5 positions"),
])
def test_a_wrong_token_is_named_before_the_calls_are_counted(learner, expected):
    fails_with(nb10.check_generate_greedy, learner, expected=expected)


def test_generate_greedy_is_accepted_with_and_without_no_grad_as_the_text_says():
    from graders.course.example_class import solution_answers

    from jaxtyping import Int

    namespace = {"torch": torch, "nn": nn, "Tensor": torch.Tensor, "Int": Int}
    exec(compile(solution_answers("10_modern_decoder")["generate_answer"], "generate_answer", "exec"), namespace)
    plain = namespace["generate_greedy"]
    assert "@torch.no_grad" not in solution_answers("10_modern_decoder")["generate_answer"]
    nb10.check_generate_greedy(plain)
    nb10.check_generate_greedy(torch.no_grad()(plain))
    prompt = torch.tensor([[3, 1, 4]])
    assert torch.equal(plain(ref.ModernDecoder(ref.ModernConfig()), prompt, 0), prompt)
    posed = _markdown_before("10_modern_decoder", "generate_answer")
    assert "`n_new = 0`" in posed and "torch.no_grad()" in posed


def _markdown_before(notebook, grade_id):
    import nbformat

    from graders.layout import SOLUTIONS

    text = []
    for cell in nbformat.read(SOLUTIONS / f"{notebook}.ipynb", as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return "\n".join(text)
        text = text + [cell.source] if cell.cell_type == "markdown" else []
    raise AssertionError(f"no cell {grade_id}")


def test_generate_greedy_passes_and_its_mistakes_are_named():
    nb10.check_generate_greedy(_generate())
    nb10.check_generate_greedy(_generate(), seed=3, batch=3, seq=4)
    fails_with(nb10.check_generate_greedy, _generate(cache=False),
               expected="Likely mistake: the cache is not used: the whole sequence is fed again")
    fails_with(nb10.check_generate_greedy, lambda model, tokens, n_new: _generate()(model, tokens, n_new)[:, -n_new:],
               expected="Likely mistake: only the new tokens are returned")
