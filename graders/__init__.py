"""Grading core of the course *GPT-2 from scratch, autograded*.

The learner-facing entry points live in one module per notebook (``graders.nb01`` ...);
they all share :mod:`graders.engine` for comparing outputs and naming mistakes, and
:mod:`graders.reference` for the reference GPT-2 small (pretrained or synthetic).
"""
