"""Front ends: constraint languages lowered to the grammar IR (:mod:`..ir`).

- :mod:`.regex` (with the character classes of :mod:`.regex_classes`): Python ``re``
  syntax, :func:`~.regex.regex_to_ir`;
- :mod:`.lark`: Lark EBNF grammars, :func:`~.lark.lark_to_grammar`;
- :mod:`.gbnf`: GBNF grammars (llama.cpp's dialect), :func:`~.gbnf.gbnf_to_grammar`.

(The JSON Schema front end is :mod:`..json_schema`.) The modules load on first use (lark
is imported only by :mod:`.lark`).
"""
