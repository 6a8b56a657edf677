"""Grading core of the course *GPT-2 from scratch, autograded*, in five layers and one concern:

- ``graders.reference``: the reference GPT-2 small (pretrained or synthetic), its weights under
  the course's names, tokenizer, data, and the course's own components;
- ``graders.judging``: cases, the one tolerance policy, comparison and diagnosis, running
  learner code, and ``Exercise``, which declares how each exercise is produced and judged;
  what a learner's kernel shows of a check (rendering, progress);
- ``graders.exercises``: one package per notebook (``nb01`` ... ), the learner-facing checks,
  and ``common``, what several notebooks share (naming mistakes, watching submodules, the
  next-token loss);
- ``graders.harness``: running a submission in a sandboxed kernel and judging it outside,
  for one notebook (``check``), one student or a whole class (``classroom``);
- ``graders.course``: generating, releasing and running the notebooks; the example class;
- ``graders.integrity``: keeping the course's answer out of the learner's kernel and library
  answers out of their code, used through ``graders.integrity`` (the kernel's side, beside
  judging) and ``graders.integrity.host`` (the grading host's, beside the harness) only.
"""

RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code
