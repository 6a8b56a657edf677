"""Notebook 06's text poses what its checks grade: every config field count_parameters reads, the frozen
unembedding bias, the debug flag."""
from graders.reference.config import Config
from test_catalog_06_parameter_count import _solution_count_parameters


# --- the text -----------------------------------------------------------------------------------

def _cells():
    import nbformat

    from graders.layout import SOLUTIONS
    return nbformat.read(SOLUTIONS / "06_gpt2.ipynb", as_version=4).cells


def _text_before(grade_id):
    """The markdown from the previous code cell up to the cell `grade_id` (where it is posed)."""
    cells, text = _cells(), []
    for cell in cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return "\n".join(text)
        text = text + [cell.source] if cell.cell_type == "markdown" else []
    raise AssertionError(f"no cell {grade_id}")


def test_count_parameters_is_posed_with_every_config_field_the_solution_reads():
    read = set()

    class Recording(Config):
        def __getattribute__(self, name):
            read.add(name)
            return super().__getattribute__(name)

    _solution_count_parameters()(Recording())
    posed = _text_before("count_answer")
    assert read and not [field for field in read if f"`{field}`" not in posed], sorted(read)


def test_the_frozen_unembedding_bias_is_explained_where_unembed_is_posed():
    """The given `__init__` creates b_U with requires_grad=False; the text says so and why."""
    given = next(c.source for c in _cells() if c.metadata.get("nbgrader", {}).get("grade_id") == "unembed_answer")
    posed = _text_before("unembed_answer")
    assert "requires_grad=False" in given and "`requires_grad=False`" in posed
    assert "no\nunembedding bias" in posed or "no unembedding bias" in posed


def test_the_debug_flag_print_cfg_shows_is_explained_before_it_shows():
    setup = next(i for i, c in enumerate(_cells()) if "print(cfg)" in c.source)
    before = "\n".join(c.source for c in _cells()[:setup] if c.cell_type == "markdown")
    assert "debug" in vars(Config()) and "`debug=True`" in before
