"""The inputs of one check (`Case`) and the reference activations a case is judged against."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

import torch

from graders.judging import session
from graders.reference.config import Config

REFERENCE_TEXT = ("I am an amazing autoregressive, decoder-only, GPT-2 style transformer. "
                  "One day I will exceed human level intelligence and take over the world!")


class ReferenceWithheld(RuntimeError):
    """Reference activations were asked for inside a grading kernel."""


@dataclass(frozen=True)
class Case:
    """The inputs of one check. Visible checks use the defaults; hidden tests vary them."""
    text: str | None = REFERENCE_TEXT   # a text, or None for random tokens from `seed`
    seed: int = 0
    batch: int = 1
    seq: int = 20                       # length of random token sequences
    block: int = 0                      # which transformer block's weights and activations
    # Settings of the learner's Config other than GPT-2 small's (None: the default). Hidden checks
    # set them where an exercise says to read a setting from cfg, so that a hard-coded value fails.
    layer_norm_eps: float | None = None
    n_heads: int | None = None
    d_head: int | None = None
    n_ctx: int | None = None
    n_layers: int | None = None
    rms_norm_eps: float | None = None   # notebook 10's ModernConfig
    rope_theta: float | None = None

    def settings(self) -> dict:
        """The Config settings this case changes, by name."""
        return {name: getattr(self, name) for name in CONFIG_FIELDS if getattr(self, name) is not None}

    def config(self, base: Config | None = None) -> Config:
        """`base` (default: GPT-2 small's Config) with this case's settings."""
        return replace(base or Config(), **self.settings())

    def tokens(self) -> torch.Tensor:
        if self.text is not None:
            from graders.reference.tokenizer import to_tokens

            return to_tokens([self.text] * self.batch)
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, Config().d_vocab, (self.batch, self.seq), generator=generator)

    def describe(self) -> str:
        what = "the reference text" if self.text == REFERENCE_TEXT else (
            f"text {self.text[:30]!r}" if self.text else f"random inputs (seed {self.seed})")
        settings = ", ".join(f"{name} {value:g}" for name, value in self.settings().items())
        return (f"{what}, batch {self.batch}" + (f", block {self.block}" if self.block else "")
                + (f", config with {settings}" if settings else ""))


CONFIG_FIELDS = ("layer_norm_eps", "n_heads", "d_head", "n_ctx", "n_layers", "rms_norm_eps", "rope_theta")


# The keyword arguments of a check function that choose its case (the others go to the learner).
CASE_FIELDS = frozenset(f.name for f in dataclasses.fields(Case))


def activations(case: Case) -> dict[str, torch.Tensor]:
    """The reference's graded activations on `case`'s tokens (judge side, and learners' demos)."""
    if session.kernel().session.recording:
        raise ReferenceWithheld(
            "The reference activations are withheld while a notebook is graded, so this "
            "demonstration cell is skipped; it runs as usual in your own JupyterLab.")
    from graders.reference.activations import reference_activations
    from graders.reference.store import reference_id

    return reference_activations(reference_id(), case.tokens())


def rand_float(seed: int, *shape: int) -> torch.Tensor:
    """Random fp32 input for shape checks, as in the classic rand_float_test."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def rand_int(seed: int, *shape: int) -> torch.Tensor:
    """Random token ids for shape checks, as in the classic rand_int_test."""
    return torch.randint(100, 1000, shape, generator=torch.Generator().manual_seed(seed))


def unseen_variant(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A seeded variant of a reference input that no file holds (rescaled, with noise of a
    quarter of its spread), still shaped like real activations so that subtle mistakes show.
    The kernel makes it from the input it received; the judge remakes it from the reference."""
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(10_000 + seed))
    return x * 1.3 + noise * (x.std() * 0.25)
