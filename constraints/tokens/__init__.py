"""Token level: the vocabulary as a byte trie, walked from automaton states.

- :mod:`.trie`: :class:`~.trie.VocabIndex`, the DFS-ordered byte trie of a vocabulary and
  its numba walks (one per vocabulary, shared by every compiled constraint);
- :mod:`.rows`: the numba kernels of cold mask rows shared per vocabulary (canonical
  forms of the permissive parts of an automaton).
"""
