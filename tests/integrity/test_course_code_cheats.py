"""Integrity round 3: an answer that is the course's own implementation scores nothing, in every
notebook with a class or function exercise, whichever way it reaches that code (an import under
a computed name, a subclass, an alias, the source read and executed, the file read and
executed, a call from the learner's own code), and the check names what was reached.
The correct answers of every style pass: each notebook's catalog test holds them."""
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

from graders.exercises import find
from graders.judging.compare import CheckFailed
from course_code import as_cell

# (check, the course's implementation of what it grades, as module:name)
COURSE_ANSWERS = {
    "01 LayerNorm": ("01_layernorm", "LayerNorm", "graders.reference.components:LayerNorm"),
    "02 Embed": ("02_embeddings", "Embed", "graders.reference.components:Embed"),
    "03 Attention": ("03_attention", "Attention", "graders.reference.components:Attention"),
    "04 gelu_new": ("04_mlp", "gelu_new", "graders.reference.components:gelu_new"),
    "04 MLP": ("04_mlp", "MLP", "graders.reference.components:MLP"),
    "05 TransformerBlock": ("05_transformer_block", "TransformerBlock",
                            "graders.reference.components:TransformerBlock"),
    "06 DemoTransformer": ("06_gpt2", "DemoTransformer", "graders.reference.components:DemoTransformer"),
    "07 lr_at": ("07_training", "lr_at", "graders.exercises.nb07.tasks:reference_lr"),
    "08 apply_top_k": ("08_sampling", "apply_top_k", "graders.exercises.nb08.reference:apply_top_k"),
    "09 PostNormBlock": ("09_transformer_family", "PostNormBlock", "graders.reference.bert:PostNormBlock"),
    "10 RMSNorm": ("10_modern_decoder", "RMSNorm", "graders.exercises.nb10.reference:RMSNorm"),
    "11 bytes_to_unicode": ("11_tokenizer", "bytes_to_unicode",
                            "graders.exercises.nb11.reference:bytes_to_unicode"),
    "11 pretokenize": ("11_tokenizer", "pretokenize", "graders.exercises.nb11.reference:pretokenize"),
    "11 train_bpe": ("11_tokenizer", "train_bpe", "graders.exercises.nb11.reference:train_bpe"),
    "12 AdamW": ("12_training_step", "AdamW", "graders.exercises.nb12.reference:VariantAdamW"),
    "13 sft_loss": ("13_post_training", "sft_loss", "graders.exercises.nb13.reference:sft_loss"),
    "13 dpo_loss": ("13_post_training", "dpo_loss", "graders.exercises.nb13.reference:dpo_loss"),
}


def _obfuscated(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module("gra" + module[3:]), name)


def _executed(source: str, name: str):
    namespace: dict = {"__name__": "__main__"}   # a name sys.modules knows (dataclasses look it up)
    exec(source, namespace)
    return namespace[name]


def _wrapped(course):
    if inspect.isclass(course) and issubclass(course, torch.optim.Optimizer):
        class MyOptimizer(torch.optim.Optimizer):
            def __init__(self, params, **settings):
                self.inner = course(params, **settings)
                super().__init__(self.inner.param_groups, self.inner.defaults)
                self.state = self.inner.state

            def step(self, closure=None):
                return self.inner.step()
        return MyOptimizer
    if inspect.isclass(course):
        class Mine(nn.Module):
            def __init__(self, *args):
                super().__init__()
                self.inner = course(*args)

            def forward(self, *args):
                return self.inner(*args)
        return Mine

    def mine(*args, **kwargs):
        return course(*args, **kwargs)
    return mine


def _subclass_or_alias(course):
    return type(course.__name__, (course,), {}) if inspect.isclass(course) else course


STYLES = {
    "imported under a computed name": lambda target: _subclass_or_alias(_obfuscated(target)),
    "aliased": lambda target: _obfuscated(target),
    "source read with inspect and executed": lambda target: _executed(
        inspect.getsource(importlib.import_module(target.split(":")[0])), target.split(":")[1]),
    "file found, read and executed": lambda target: _executed(
        Path(importlib.util.find_spec(target.split(":")[0]).origin).read_text(), target.split(":")[1]),
    "called from the learner's own code": lambda target: _wrapped(_obfuscated(target)),
}
COMPILED = ("source read with inspect and executed", "file found, read and executed")


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("exercise", COURSE_ANSWERS)
def test_the_course_code_as_an_answer_scores_nothing_and_is_named(exercise, style):
    notebook, name, target = COURSE_ANSWERS[exercise]
    answer = STYLES[style](target)
    check = find((notebook, name))
    with pytest.raises(CheckFailed) as failure:
        check.check(answer, check.case())
    message = str(failure.value)
    where = "graders/" + target.split(":")[0].removeprefix("graders.").replace(".", "/") + ".py"
    assert where in message, message
    expected = "compiled from a string" if style in COMPILED else "the course's own implementation"
    assert expected in message.splitlines()[0], message


# A course method run on the learner's own object (its own __init__, the course's forward): the
# runtime check alone sees it, since the class holds nothing of the course's.
BORROWED_METHOD = '''
import importlib
import torch
from torch import nn

class {name}(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model)){bias}

    def forward(self, x):
        course = importlib.import_module("gra" + "{module}")
        return vars(course.{name})["forward"](self, x)
'''


@pytest.mark.parametrize("exercise", ["01 LayerNorm", "10 RMSNorm"])
def test_a_course_method_run_on_the_learners_own_object_scores_nothing(exercise):
    notebook, name, target = COURSE_ANSWERS[exercise]
    namespace = {"__name__": "__main__"}
    bias = "\n        self.b = nn.Parameter(torch.zeros(cfg.d_model))" if name == "LayerNorm" else ""
    source = BORROWED_METHOD.format(name=name, module=target.split(":")[0][3:], bias=bias)
    exec(as_cell(source, exercise), namespace)
    check = find((notebook, name))
    with pytest.raises(CheckFailed) as failure:
        check.check(namespace[name], check.case())
    assert f"({name}.forward), the course's own implementation" in str(failure.value).splitlines()[0]


# A course function handed to a library that calls it back (torch's checkpoint): only library code
# sits between the learner's code and the course's.
THROUGH_A_LIBRARY = '''
import importlib
import torch
import torch.utils.checkpoint
from torch import nn

def gelu_new(x):
    course = importlib.import_module("gra" + "ders.reference.components")
    return torch.utils.checkpoint.checkpoint(course.gelu_new, x, use_reentrant=False)

class RMSNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x):
        course = importlib.import_module("gra" + "ders.exercises.nb10.reference")
        return torch.utils.checkpoint.checkpoint(course.rms_norm, x, self.w, self.cfg.rms_norm_eps,
                                                 use_reentrant=False)
'''


@pytest.mark.parametrize("exercise, reached", [("04 gelu_new", "gelu_new"), ("10 RMSNorm", "rms_norm")])
def test_a_course_function_run_by_a_library_for_the_learner_scores_nothing(exercise, reached):
    notebook, name, target = COURSE_ANSWERS[exercise]
    namespace = {"__name__": "__main__"}
    exec(as_cell(THROUGH_A_LIBRARY, exercise), namespace)
    check = find((notebook, name))
    with pytest.raises(CheckFailed) as failure:
        check.check(namespace[name], check.case())
    first = str(failure.value).splitlines()[0]   # 04's tripwire on the course's gelu_new may see it first
    assert (f"({reached}), the course's own implementation" in first
            or f"graders.reference.components.{reached}" in first), first
