RUNS_IN_LEARNER_CODE = True   # graders.marks: this file's code may run inside the learner's code

