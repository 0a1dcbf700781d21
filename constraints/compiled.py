"""A compiled constraint: the automaton joined to the vocabulary, with memoised mask rows.

Immutable from the outside and shared by every request that uses the same constraint.
Rows are computed on first visit and kept, so the steady-state step is a lookup; a cold
row is computed under the constraint's lock (its kernels share scratch space).

A cold row (see :meth:`CompiledConstraint._context_independent`): a permissive state
(inside a JSON string) takes the tokens without ``"`` from a row shared per vocabulary,
keyed by the canonical form of what it reaches over other bytes (numba kernels in
:mod:`.tokens.rows`; a region is minimised or matched against known forms once, then
every state in it is a lookup; JSON key and value strings are primed when a compiler is
made for the vocabulary); every other walk takes the fast trie walk of :mod:`.tokens.trie` (whole subtrees
at once where the automaton provably stays alive). Pushdown boundaries continue through
memoised closures. The pure-Python canonical form and ``VocabIndex.walk`` stay as
references for the tests.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict

import numpy as np

from .automaton import counted as ct
from .automaton import pushdown
from .automaton.dfa_kernels import near_kernel
from .automaton.nfa import equivalent_blocks
from .automaton.pushdown import Automaton, Config, make_config
from .automaton.tables import flags, ints
from .bitmask import unpack_bitmask
from .ir import SPECIAL_LEAD, special_bytes
from .native import bind
from .tokens.rows import canonical_key, count_bytes, match_form, near_form, unquoted_region
from .tokens.trie import F_SUB, F_TOK_END, F_TOK_LO, WalkMemo, counted_loops

ROW_CACHE_SIZE = 8192
STEP_MEMO_SIZE = 1 << 18  # steps a constraint's step memo keeps before it starts afresh
QUOTE = 0x22
PERMISSIVE_BYTES = 128  # states allowing at least this many bytes take the shared-row path
MAX_CANON_STATES = 256  # states of a region minimised for its canonical form
# a region may match a form already met by the vocabulary however large it is, in an automaton
# of at most this many states (a match is one search, no minimisation): the key position of an
# object of many optional properties (every name still to come, and any other key) then takes
# the row of any JSON string's text, where each of its states would walk the whole trie
MAX_CANON_AUTOMATON = 4096
MAX_FORMS = 16  # canonical forms a vocabulary remembers for matching (most recent first)
# shared rows a vocabulary keeps (then it starts afresh): maskbench-dev's 307 schemas meet 9
# forms, but each request may bring new ones, and a row is 16 KB on a 128k vocabulary
MAX_SHARED_ROWS = 1024
MAX_FORM_TRIES = 4
CLOSURE_MEMO_SIZE = 4096
MANY_STACKS = 16  # a row's stacks not kept from which their parts are walked at once
PART_CACHE_SIZE = 8192  # pushdown row parts kept per constraint (by view, by whole stack)
CONTINUATION_MEMO_SIZE = 2048  # continuation walks kept per constraint (their set bits only)
# automata with counters of at least this many states search, when compiled, which states
# are near a bound or a region (a few ms per 1,000 states), instead of at their first row
NEAR_AT_COMPILE = 2000
# a permissive state without a canonical form (its quote-free part reaches a call, or is too
# large to minimise) takes its short tokens (_short_token_bytes) from the part kept for the
# states alike that deep, when a search of at most MAX_NEAR_STATES states tells
# (_short_part); NEAR_PARTS such parts are kept per constraint, then it starts afresh
SHORT_TOKEN_BYTES = (16, 20, 24, 32)  # the first that leaves at most LONG_TOKENS longer ones
LONG_TOKENS = 400
MAX_NEAR_STATES = 1024
NEAR_PARTS = 64
NEAR_FORM_BYTES = 4 << 20  # the numberings kept beside the parts, in all
# a walk below trie nodes with at least 1/BELOW_FORM_SHARE of the vocabulary below them is kept
# by its start's numbering too (_below_form: a search that costs what a small walk does)
BELOW_FORM_SHARE = 16
# rows and row parts kept per state (a walk's, a state's tokens without '"', their margins
# near a bound: _remember), at most this many per memo, then it starts afresh; each holds
# a row (16 KB on a 128k vocabulary), a margin table a token's int64 (1 MB there)
STATE_MEMO_SIZE = 1024
MARGIN_MEMO_SIZE = 32
_MISS = object()


class CompiledConstraint:
    """An automaton over a vocabulary. Create matchers with ``Matcher(compiled)``."""

    # every walk takes the fast kernel (it enters the trie only at live first bytes); its
    # shortcut needs a memo per automaton (~5-20 µs to make), made by the first walk from a
    # state allowing at least this many bytes; over 256: never (the reference walks)
    fast_min_bytes = 16

    def __init__(
        self,
        automaton: Automaton,
        vocab,
        kind: str,
        spec: str,
        notes: list[str] | None = None,
        specials: tuple[int, ...] = (),
    ):
        self.automaton = automaton
        # special tokens the grammar names: id -> the IR's bytes for it (see ir.special_bytes);
        # ordinary tokens holding the lead byte are kept out of the rows (text never spells one)
        self.specials: dict[int, bytes] = {i: special_bytes(i) for i in specials}
        self._lead_words: np.ndarray | None = None
        self.vocab = vocab
        self.kind = kind
        self.spec = spec
        self.notes = list(notes or [])  # e.g. JSON Schema keywords relaxed in lenient mode
        # a JSON schema compiled with a narrower whitespace than asked for (Compiler.json_schema)
        self.whitespace_used: str | None = None
        self.index = vocab.index()
        a = automaton
        self._cls_sizes = np.bincount(a.cls, minlength=a.table.shape[1])  # bytes per class
        self._bnd_bottom = a.has_calls.copy()
        self._bnd_inner = a.has_calls | a.accepting
        self._counters = a.counters
        q = int(a.cls[QUOTE])  # the class of '"' where it holds that byte alone, else -1
        self._quote_cls = q if self._cls_sizes[q] == 1 else -1
        self._bare_any = False  # (see below: automata with counted repetitions)
        # rows of permissive states without a canonical form take their tokens without '"'
        # by length (_by_length): in automata with counters, and in those too large for every
        # region to have a form (MAX_CANON_AUTOMATON); the tries are built or loaded now, not
        # in a mask
        self._by_length_on = self._quote_cls >= 0 and (
            a.counters is not None or a.n_states > MAX_CANON_AUTOMATON
        )
        if self._by_length_on:
            vocab.length_split(QUOTE, _short_token_bytes(vocab))
        if a.counters is not None:
            # counts beyond a token's reach look alike: a token starts at most max_depth items
            self._count_cap = self.index.max_depth + 1
            # per state: the most items a token may still need below hi (a token starts at most
            # max_depth items, and meets states needing up to the most ``need`` reachable)
            cnt = a.counters
            inside = np.flatnonzero(cnt.region >= 0)
            local = np.full(a.n_states + 1, len(inside), dtype=np.int64)  # others -> a sink
            local[inside] = np.arange(len(inside))
            sub = a.table[inside]
            stay = (sub >= 0) & ((cnt.act[inside] & (ct.EXIT | ct.ENTER)) == 0)
            sub = local[np.where(stay, sub, a.n_states)]
            most = np.append(cnt.need[inside], 0)
            for _ in range(len(inside)):  # the most need reachable inside the region: a fixpoint
                nxt = np.maximum(most[:-1], most[sub].max(axis=1)) if sub.shape[1] else most[:-1]
                if (nxt == most[:-1]).all():
                    break
                most[:-1] = nxt
            caps = np.full(a.n_states, self._count_cap, dtype=np.int64)
            caps[inside] += most[:-1]
            self._hi_caps = ints(caps)
            # per region state met near a bound: what of the count its tokens see (_count_marks)
            self._caps: dict[int, tuple[list[int], list[int]]] = {}
            _warm_up_counted(self.index)
            self.index.subtree_columns()  # (now, not in a mask; the tries without '"' too, if built)
            split = vocab.split_index_if_built(QUOTE)
            if split is not None:
                split[0].subtree_columns()
            # states with a bound on a byte other than '"' (entering or leaving a region
            # that is not a JSON string): see _compute_counted
            bare = (a.counters.act & (ct.EXIT | ct.ENTER)) != 0
            if self._quote_cls >= 0:
                bare[:, self._quote_cls] = False
            self._bare = bare.any(axis=1)
            self._bare_any = bool(self._bare.any())
            inside = cnt.region >= 0  # regions whose states neither call nor end a rule
            self._closed_regions = not (a.accepting[inside] | a.has_calls[inside]).any()
            self._near: bytes | None = None  # (flags per state)
            if a.n_states >= NEAR_AT_COMPILE:  # (searches of tens of ms: not mid-output)
                self._bare_near(a.start)
                if not a.is_regular:
                    self._near_region()
        self._ci: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = {}
        # how many states a match with a known canonical form may meet (MAX_CANON_AUTOMATON)
        self._canon_cap = a.n_states if a.n_states <= MAX_CANON_AUTOMATON else MAX_CANON_STATES
        self._closures: dict = {}  # stack -> its closure and the reads, for continuations
        # the parts of pushdown rows (see _stack_part): by the top frames their walks read
        # (with how much longer than itself a stack their walks met), by the whole stack; the
        # deepest view kept; the shortest and longest stacks the part being walked read
        self._views: dict = {}
        self._parts: dict = {}
        self._interned_parts: dict[bytes, np.ndarray] = {}
        self._view_max = 0
        self._lowest = self._highest = 0
        self._walks_below: dict = {}  # continuation walks: see _walk_below
        self._below_forms = _FormMemo(CONTINUATION_MEMO_SIZE)  # the same, by their start's numbering
        self._continued: dict = {}  # continuations: see _continue
        # set while walking tokens without '"' from frames outside every region, in an
        # automaton whose regions only '"' enters or leaves: no count can change, so the
        # walks of frames that would carry one are plain walks (see _split_part)
        self._plain = False
        self._ci_plain: dict = {}  # state -> its plain walk over the tokens without '"'
        self._near_forms = _FormMemo(NEAR_PARTS)  # parts kept by _short_part
        self._split = None  # (tries without / with ", shared rows) of the vocabulary
        self._lock = threading.Lock()
        self._rows: OrderedDict = OrderedDict()
        self._interned: dict[bytes, np.ndarray] = {}
        self._eos = np.array(vocab.eos_ids, dtype=np.int64)
        # accepted steps seen before (remember_step): the common accept is two dict hits,
        # configuration -> {token: the next configuration}; one dict per configuration, not a
        # (configuration, token) tuple per step, which the collector would walk in every full
        # collection (a configuration of a pushdown automaton keeps the tuple tracked)
        self.step_memo: dict = {}
        self._step_entries = 0
        self._step_configs: dict = {}  # the configurations in it, equal ones as one object
        # a run-time check the automaton cannot express, set by whoever compiled the
        # constraint (uniqueItems: see .unique_items.attach); Matcher(compiled) returns its
        # matchers. None for every other constraint
        self.check = None

    def accepts(self, text: bytes | str) -> bool:
        """Is ``text`` a whole output of the constraint (a str is taken as its UTF-8 bytes)?
        One walk of the automaton, with the run-time check where there is one (uniqueItems):
        linear in the text, unlike ``re.fullmatch``, which may backtrack; no tokens and no
        masks involved. The same language as the matcher's, EOS at the end."""
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if self.check is not None:
            return self.check.accepts(data)
        return self.automaton.accepts(data)

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def n_words(self) -> int:
        return self.index.n_words

    @property
    def initial(self):
        return self.automaton.initial

    # ----------------------------------------------------------------------- rows

    def mask_row(self, config) -> np.ndarray:
        """The int32 bitmask row of a configuration (shared; do not modify)."""
        row = self._rows.get(config)
        if row is not None:
            return row
        key = config
        if self._counters is not None:  # rows of counted regions are kept by _row_key
            key = self._row_key(config)
            row = self._rows.get(key)
            if row is not None:
                return row
        with self._lock:  # cold rows share scratch space (numba kernels run without the GIL)
            row = self._rows.get(key)
            if row is not None:
                return row
            return self._cold_row(key, config)

    def _row_key(self, config):
        """What a row of an automaton with counted repetitions depends on: the state, and
        inside a region the distances to its bounds, capped beyond a token's reach (no
        token starts more items than it has bytes; hi is met with ``need`` more). In a
        pushdown automaton, the same for each stack (:meth:`_stack_key`)."""
        a = self.automaton
        if not a.is_regular:
            stacks = []
            changed = False
            for st in config[0]:
                k = self._stack_key(st)
                if k != st:
                    changed = True
                stacks.append(k)
            return make_config(stacks, config[1]) if changed else config
        return self._row_key_int(config)

    def _stack_key(self, st: tuple[int, ...]) -> tuple[int, ...]:
        """A stack as far as a token can see it: its top frame by :meth:`_row_key_int` (a
        region calls no rule, so a count lives in the top frame only)."""
        return st[:-1] + (self._row_key_int(st[-1]),)

    def _row_key_int(self, config: int):
        a = self.automaton
        n = a.n_states
        s = config % n
        r = a._region_list[s]
        if r < 0:
            return s
        c = config // n
        hi_left, lo_left = a._hi_list[r] - c, max(a._lo_list[r] - c, 0)
        hi_cap, lo_cap = self._hi_caps[s], self._count_cap  # (bounds by the tokens' length)
        if hi_left >= hi_cap and (lo_left == 0 or lo_left >= lo_cap):  # far from both bounds
            return (s, hi_cap, min(lo_left, lo_cap))
        # near a bound: the counts between two of the tokens' own margins (exits) look alike
        # (a key of another length: never equal to a far one)
        his, los = self._caps.get(s) or self._count_marks(s)
        return (s, bisect_right(his, hi_left), bisect_left(los, lo_left) if lo_left else -1, 0)

    def _count_marks(self, s: int) -> tuple[list[int], list[int]]:
        """What of the count the tokens from region state ``s`` see (one walk of the
        vocabulary's trie, ``VocabIndex.count_reach``): their margins below hi and the items
        started before their exits, sorted. Two counts with as many
        margins at or below ``hi - c`` and as many exits at or above ``lo - c`` (``lo - c`` both
        0 or both positive: the automaton may end at one only) allow the same tokens. Where a
        bound by the tokens' length alone (``max_depth`` items) would keep a row per count
        near a bound, a pattern like ``(\\S+\\s+){0,99}`` needs a few (its tokens start an item
        or two), and a string's length bound one per distinct length of the long tokens."""
        a = self.automaton
        marks = self._caps[s] = self.index.count_reach(
            a.table, a.counters, a.cls, s, self._hi_caps[s], loops=self._loops()
        )
        return marks

    def _cold_row(self, key, config) -> np.ndarray:
        a = self.automaton
        end = a.can_end(config)
        if not a.is_regular and len(config[0]) == 1 and not self.specials and not end:
            # one stack, nothing to add: the row is its part, already kept once by its bits
            # (read-only), not copied and kept again
            row = self._stack_part(config[0][0]).view(np.int32)
        else:
            words = self._compute(config)
            if self.specials:
                self._add_specials(config, words)
            if end:
                for e in self._eos:
                    words[e >> 5] |= np.uint32(1) << np.uint32(e & 31)
            data = words.tobytes()
            row = self._interned.get(data)
            if row is None:
                row = words.view(np.int32)
                row.flags.writeable = False
                if len(self._interned) >= ROW_CACHE_SIZE:  # (bounded as the rows are)
                    self._interned.clear()
                self._interned[data] = row
        self._rows[key] = row
        if len(self._rows) > ROW_CACHE_SIZE:
            self._rows.popitem(last=False)
        return row

    def _add_specials(self, config, words: np.ndarray) -> None:
        """The named special tokens the automaton takes from ``config`` join the row; ordinary
        tokens holding the special lead byte leave it."""
        if self._lead_words is None:  # (once per vocabulary)
            cached = self.vocab.__dict__.get("_special_lead_words")
            if cached is None:
                lead = np.zeros(self.n_words, dtype=np.uint32)
                for i, b in enumerate(self.vocab.token_bytes):
                    if b is not None and SPECIAL_LEAD in b:
                        lead[i >> 5] |= np.uint32(1) << np.uint32(i & 31)
                cached = self.vocab.__dict__["_special_lead_words"] = ~lead
            self._lead_words = cached
        words &= self._lead_words
        a = self.automaton
        for i, data in self.specials.items():
            if i < self.vocab_size and a.step_bytes(config, data) is not None:
                words[i >> 5] |= np.uint32(1) << np.uint32(i & 31)

    def token_data(self, token_id: int) -> bytes | None:
        """The bytes the automaton reads for ``token_id``: its text, the IR's bytes of a
        special token the grammar names, None for a token it never takes (another special
        token; with named special tokens, an ordinary token holding their lead byte)."""
        sp = self.specials.get(token_id) if self.specials else None
        if sp is not None:
            return sp
        data = self.vocab.token_bytes[token_id] if 0 <= token_id < self.vocab_size else None
        if data and self.specials and SPECIAL_LEAD in data:
            return None
        return data

    def mask_row_eos_only(self) -> np.ndarray:
        """The row after EOS was accepted: only EOS again (never an empty row)."""
        row = getattr(self, "_eos_row", None)
        if row is None:
            words = np.zeros(self.n_words, dtype=np.uint32)
            for e in self._eos:
                words[e >> 5] |= np.uint32(1) << np.uint32(e & 31)
            row = words.view(np.int32)
            row.flags.writeable = False
            self._eos_row = row
        return row

    def _context_independent(self, state: int, inner: bool):
        """Walk the whole trie from ``state``: tokens read within the state's own rule,
        plus the boundary pairs where a call or a return may continue the token.

        A permissive state (many bytes allowed, e.g. inside a string) takes the shared
        path: tokens without ``"`` come from a row shared by every state — of any
        compilation — whose unquoted sub-automaton is the same (see
        :meth:`_canonical_unquoted`); only tokens with ``"`` are walked for this state. A
        bottom frame's permissive state whose region is too large for a form (a long string
        unrolled) takes its tokens without ``"`` by length (:meth:`_by_length`) instead.
        """
        key = (state, inner)
        hit = self._ci.get(key)
        if hit is not None:
            words, nodes, states, split = hit
            return words, nodes, states, self._split[0][1] if split else self.index
        a = self.automaton
        n_bytes = count_bytes(a.table, self._cls_sizes, state)
        canon = self._permissive_form(state, n_bytes, inner)
        base = None  # the tokens without '"', where they are walked apart from the others
        if canon is not None:
            (no_quote, _), shared = self._quote_split()
            base = shared.get(canon)
            if base is None:
                base = np.zeros(self.n_words, dtype=np.uint32)
                self._walk_state(no_quote, state, inner, base, True)
                base.flags.writeable = False
                _share(shared, canon, base)
        elif n_bytes >= PERMISSIVE_BYTES and not inner and self._by_length_on:
            # a region too large for a form (a long unrolled string): by length, the short
            # tokens' part kept for the states alike as deep as they read
            base = self._by_length(state)
        if base is None:
            trie = self.index
            words = np.zeros(self.n_words, dtype=np.uint32)
            nodes, states = self._walk_state(trie, state, inner, words, n_bytes >= self.fast_min_bytes)
        else:
            words = base.copy()
            trie = self._quote_split()[0][1]  # boundary node ids below index this trie
            nodes, states = self._walk_state(trie, state, inner, words, False)
        # (kept without the trie object: a tuple of arrays and ints is one the collector
        # stops walking after its first pass)
        _remember(self._ci, key, (words, nodes, states, base is not None), STATE_MEMO_SIZE)
        return words, nodes, states, trie

    def _permissive_form(self, state: int, n_bytes: int, inner: bool) -> bytes | None:
        """The canonical form of ``state``'s tokens without '"' (:meth:`_canonical_unquoted`)
        where it is permissive (``n_bytes``, the bytes it allows, at least
        :data:`PERMISSIVE_BYTES`); None where it is not, or has no form (its region met
        before as too large: walking is cheaper than searching again)."""
        if n_bytes < PERMISSIVE_BYTES:
            return None
        big = self.__dict__.get("_canon_big")
        if big is not None and big[state] and self._canon_region[state] < 0:
            return None
        return self._canonical_unquoted(state, inner)

    def _walk_state(self, trie, state: int, inner: bool, words: np.ndarray, full: bool):
        """``trie``'s walk from ``state`` (a frame above the bottom where ``inner``) into
        ``words``: the fast walk, with the full memo where ``full`` else the light one, or the
        plain walk where the fast one is off (``fast_min_bytes`` over 256). Returns its
        boundary pairs (nodes, states)."""
        if self.fast_min_bytes <= 256:
            return trie.walk_fast(self._walk_memo(full), inner, state, words)
        a = self.automaton
        return trie.walk(a.table, a.cls, state, self._bnd_inner if inner else self._bnd_bottom, words)

    def _walk_memo(self, full: bool) -> WalkMemo:
        """What the fast walks keep per automaton: the full memo once made (``full``
        makes it), else a light one (no shortcut)."""
        m = self.__dict__.get("_wmemo")
        if m is None:
            if not full:
                return self._light_memo()
            a = self.automaton
            m = self._wmemo = WalkMemo(a.table, a.cls, self._bnd_bottom, self._bnd_inner)
        return m

    def _quote_split(self) -> tuple:
        """((tries of the tokens without / with '"'), the vocabulary's shared rows), on first
        use."""
        split = self._split
        if split is None:
            split = self._split = (self.vocab.split_index(QUOTE), self.vocab.shared_rows())
        return split

    def _light_memo(self) -> WalkMemo:
        """The memo without shortcuts (:meth:`WalkMemo.light`), made on first use."""
        m = self.__dict__.get("_lmemo")
        if m is None:
            a = self.automaton
            m = self._lmemo = WalkMemo.light(a.table, a.cls, self._bnd_bottom, self._bnd_inner)
        return m

    def _canonical_unquoted(self, state: int, inner: bool = False) -> bytes | None:
        """:meth:`_canonical_unquoted_ref` by numba kernels (same bytes). The region of
        ``state`` (what it reaches over bytes other than ``"``) is minimised once; every
        state of the region then takes its form from the region's quotient automaton
        (the equivalence of two states depends only on what they reach)."""
        memo = self.__dict__.setdefault("_canon_memo", {})
        if state in memo:
            return memo[state]
        a = self.automaton
        reg = self.__dict__.get("_canon_region")
        if reg is None:
            reg = self._canon_region = np.full(a.n_states, -1, dtype=np.int32)
            self._canon_block = np.zeros(a.n_states, dtype=np.int64)
            self._canon_quotients = []
            self._canon_scratch = np.full(a.n_states, -1, dtype=np.int32)
            # states met by a search that outgrew its cap (_canon_cap): their own parts are
            # mostly as large, so rows skip the search for them (walking is cheaper)
            self._canon_big = np.zeros(a.n_states, dtype=bool)
            # calls, and in a pushdown returns (``~a.is_regular`` would be an int: -1 or -2)
            self._canon_boundary = a.has_calls | a.accepting if not a.is_regular else self._bnd_bottom
        r = int(reg[state])
        if r < 0:
            r = self._canon_find_region(state)
            if r < 0:
                memo[state] = None
                return None
        out = canonical_key(self._canon_quotients[r], self._canon_block[state]).tobytes()
        return _remember(memo, state, out, STATE_MEMO_SIZE)

    def _canon_find_region(self, state: int) -> int:
        """Register the region of ``state``: first try the forms already met by this
        vocabulary (most recent first; a match costs one search, no minimisation, over at
        most ``_canon_cap`` states), else minimise it (at most MAX_CANON_STATES states).
        Returns the region's number, -1 when it has no form."""
        a = self.automaton
        bnd, scratch = self._canon_boundary, self._canon_scratch
        forms = self.vocab.shared_forms()
        for i, entry in enumerate(forms[:MAX_FORM_TRIES]):
            form = entry[1]
            code, states, block = match_form(
                a.table, a.cls, QUOTE, bnd, state, self._canon_cap, scratch, form
            )
            if code < 0:
                if code == -2:
                    self._canon_big[states] = True
                return -1
            if code:
                if i:  # most recent first (another constraint's thread may move entries too)
                    for j, other in enumerate(forms):
                        if other is entry:
                            forms.insert(0, forms.pop(j))
                            break
                return self._canon_add(states, block, form)
        code, states, block, quotient = unquoted_region(
            a.table, a.cls, QUOTE, bnd, state, MAX_CANON_STATES, scratch
        )
        if code < 0:
            if code == -2:
                self._canon_big[states] = True
            return -1
        key = canonical_key(quotient, block[0])
        forms.insert(0, (key.tobytes(), key.reshape(-1, 256)))
        del forms[MAX_FORMS:]
        return self._canon_add(states, block, quotient)

    def _canon_add(self, states: np.ndarray, block: np.ndarray, quotient: np.ndarray) -> int:
        self._canon_quotients.append(quotient)
        r = len(self._canon_quotients) - 1
        self._canon_region[states] = r
        self._canon_block[states] = block
        return r

    def _canonical_unquoted_ref(self, state: int, inner: bool = False) -> bytes | None:
        """A canonical form of what decides tokens without ``"`` from ``state``: the part
        of the automaton reachable over the other bytes (found by a search from ``state``,
        so its cost is that part's size), minimised for definedness, its states numbered
        in BFS order by first byte. None when it has more than ``_canon_cap`` states or
        reaches a boundary state (a call or, in a pushdown, a return), whose tokens must
        be walked for real. Equal forms give equal rows for those tokens, across states and
        compilations. (:meth:`_canonical_unquoted` may give None for a part of more than
        MAX_CANON_STATES states: it does not minimise those.)"""
        memo = self.__dict__.setdefault("_canon_memo_ref", {})
        if state in memo:
            return memo[state]
        a = self.automaton
        boundary = a.has_calls | (a.accepting & ~a.is_regular)
        if a.counters is not None:
            boundary = boundary | (a.counters.region >= 0)
        local = {state: 0}
        order = [state]
        rows = []
        out: bytes | None = None
        k = 0
        while k < len(order):
            q = order[k]
            k += 1
            if boundary[q]:
                memo[state] = None
                return None
            r = a.table[q][a.cls]
            r[QUOTE] = -1
            rows.append(r)
            for t in _distinct(r):
                if t >= 0 and t not in local:
                    if len(order) >= self._canon_cap:
                        memo[state] = None
                        return None
                    local[t] = len(order)
                    order.append(t)
        n = len(order)
        sub = np.stack(rows)
        lut = np.full(a.n_states + 1, n, dtype=np.int64)  # -1 (dead) -> index n via [-1]
        lut[np.array(order)] = np.arange(n)
        tbl = np.vstack([lut[sub], np.full((1, 256), n, dtype=np.int64)])
        init = np.zeros(n + 1, dtype=np.int64)
        init[n] = 1
        block = equivalent_blocks(tbl, [], init, n)
        # canonical numbering: BFS over blocks from the start, successors by first byte
        sink = int(block[n])
        rep: dict[int, int] = {}
        for i in range(n):
            rep.setdefault(int(block[i]), i)
        ren = {int(block[0]): 0}
        queue = [int(block[0])]
        parts = []
        j = 0
        while j < len(queue):
            brow = block[tbl[rep[queue[j]]]]
            j += 1
            for nb in dict.fromkeys(brow.tolist()):  # (in order of first appearance)
                if nb != sink and nb not in ren:
                    ren[nb] = len(queue)
                    queue.append(nb)
            lut_b = np.full(int(block.max()) + 1, -1, dtype=np.int16)
            for b, i in ren.items():
                lut_b[b] = i
            parts.append(lut_b[brow].tobytes())
        out = b"".join(parts)
        memo[state] = out
        return out

    def _compute(self, config) -> np.ndarray:
        a = self.automaton
        if a.counters is not None:
            if a.is_regular:
                return self._compute_counted(config)
            return self._stacks_row(config)
        if a.is_regular:
            return self._context_independent(config, False)[0].copy()
        return self._stacks_row(config)

    def _stacks_row(self, config) -> np.ndarray:
        """A pushdown configuration's row: the union of its stacks' parts (the tokens each
        stack allows: :meth:`_stack_part`)."""
        stacks = config[0]
        if len(stacks) == 1:
            (st,) = stacks
            return self._stack_part(st).copy()
        words = np.zeros(self.n_words, dtype=np.uint32)
        if len(stacks) >= MANY_STACKS and self.automaton.counters is None and self.fast_min_bytes <= 256:
            cold = []
            for st in stacks:
                part = self._kept_part(st)
                if part is None:
                    cold.append(st)
                else:
                    words |= part
            if len(cold) >= MANY_STACKS:
                self._cold_parts(cold, words)
                return words
            stacks = cold
        for st in stacks:
            words |= self._stack_part(st)
        return words

    def _cold_parts(self, stacks: list, words: np.ndarray) -> None:
        """The parts of many stacks not kept (of an automaton without counters), into
        ``words`` at once and not kept: each top's own walk, then every continuation in one
        pass (:meth:`_continue_walks`), where the walks from stacks that differ only in their
        top frame go as one. A row of a hundred stacks or more (the item branches of an
        ``anyOf`` of objects, each alive until a key tells them apart) then takes a few
        walks, not one or two per stack; such rows rarely recur stack by stack."""
        by_trie: dict[int, tuple] = {}
        memo = self._continued
        for st in stacks:
            ci_words, nodes, states, trie = self._context_independent(st[-1], len(st) > 1)
            words |= ci_words
            if not len(nodes):
                continue
            hit = memo.get(self._continued_key(st[:-1], nodes, states, trie))
            if hit is not None:
                words[hit[0]] |= hit[1]
                continue
            entry = by_trie.get(id(trie))
            if entry is None:
                by_trie[id(trie)] = (trie, [(st[:-1], nodes, states)])
            else:
                entry[1].append((st[:-1], nodes, states))
        for trie, items in by_trie.values():
            self._continue_walks(items, words, trie)

    def _stack_part(self, st: tuple[int, ...]) -> np.ndarray:
        """The tokens stack ``st`` allows (shared; do not modify), kept by what of the stack
        they depend on: the frames its walks read (its top, and those its continuations
        return into). Walks read a stack from the top down, each frame read deciding
        whether the next one is, so when the frames read are its top ``k < len(st)`` any
        stack with those top ``k`` frames and at least one below reads the same frames and
        allows the same tokens, as long as its walks stay below the nesting bound
        (:data:`~.automaton.pushdown.MAX_STACK_DEPTH`; they meet stacks ``grow`` frames
        longer than it): the part is kept under ``st[-k:]`` with ``grow``
        (:attr:`_views`). A part that read the bottom frame, or whose walks met the bound,
        is kept under the whole stack (:attr:`_parts`). :meth:`_stack_part_ref` is the
        reference."""
        hit = self._kept_part(st)
        if hit is not None:
            return hit
        parts, views, bound = self._parts, self._views, pushdown.MAX_STACK_DEPTH
        key = st
        if self._counters is not None:
            key = self._stack_key(st)
        words = self._stack_part_ref(st)
        k = len(st) - self._lowest + 1
        grow = self._highest - len(st)
        data = words.tobytes()
        part = self._interned_parts.get(data)
        if part is None:
            part = words
            part.flags.writeable = False
            self._interned_parts[data] = part
        if k < len(st) and self._highest < bound:
            if len(views) >= PART_CACHE_SIZE:
                views.clear()
            views[key[-k:]] = (part, grow)
            if k > self._view_max:
                self._view_max = k
        else:
            if len(parts) >= PART_CACHE_SIZE:
                parts.clear()
            parts[key] = part
        if len(self._interned_parts) >= PART_CACHE_SIZE:
            self._interned_parts.clear()
        return part

    def _kept_part(self, st: tuple[int, ...]) -> np.ndarray | None:
        """Stack ``st``'s part if kept (:meth:`_stack_part`), else None."""
        key = st
        if self._counters is not None:  # a count as far as a token can see it (see _row_key)
            key = self._stack_key(st)
        hit = self._parts.get(key)
        if hit is not None:
            return hit
        views = self._views
        for k in range(1, min(self._view_max, len(st) - 1) + 1):
            hit = views.get(key[-k:])
            if hit is not None:
                if len(st) + hit[1] < pushdown.MAX_STACK_DEPTH:
                    return hit[0]
                return None  # (this stack's walks may meet the bound: walked whole)
        return None

    def _stack_part_ref(self, st: tuple[int, ...]) -> np.ndarray:
        """The tokens stack ``st`` allows, walked (the reference of :meth:`_stack_part`);
        sets :attr:`_lowest` and :attr:`_highest` to the lengths of the shortest and the
        longest stacks whose top the walks read."""
        a = self.automaton
        self._lowest = self._highest = len(st)
        if a.counters is None:
            ci_words, nodes, states, trie = self._context_independent(st[-1], len(st) > 1)
            words = ci_words.copy()
            if len(nodes):
                self._continue(st[:-1], nodes, states, words, trie)
            return words
        n = a.n_states
        if len(st) == 1:  # the bottom frame holds the count
            words = np.zeros(self.n_words, dtype=np.uint32)
            self._bottom_counted(st[0], words)
        elif self._split_safe(st):  # tokens without '"' meet no region: walked plain
            words = np.zeros(self.n_words, dtype=np.uint32)
            self._split_part(st, words)
        elif self._counted_frame(st):  # near a region in a called rule: the counted walk
            words = np.zeros(self.n_words, dtype=np.uint32)
            top, count = st[-1] % n, st[-1] // n
            nodes, states = self.index.walk_counted(
                a.table, a.counters, a.cls, top, count, words, self._bnd_inner, loops=self._loops()
            )
            if len(nodes):
                self._continue(st[:-1], nodes, states, words, self.index)
        else:
            ci_words, nodes, states, trie = self._context_independent(st[-1], True)
            words = ci_words.copy()
            if len(nodes):
                self._continue(st[:-1], nodes, states, words, trie)
        return words

    def _split_safe(self, st: tuple[int, ...]) -> bool:
        """Can stack ``st`` (of two frames or more) take its tokens without '"' apart from
        the others (:meth:`_split_part`)? So when every region is entered and left only over
        '"' (no other byte enters or leaves one: see :attr:`_bare`), and either no frame of
        ``st`` is in a region (such a token then never starts or ends an item: counts stay
        0) or only the top is, in a region no token leaves but over '"' (none of its states
        calls a rule or may end its rule: :attr:`_closed_regions`)."""
        if self._quote_cls < 0 or self._bare_any:
            return False
        a = self.automaton
        region, n = a._region_list, a.n_states
        for f in st[:-1]:
            if f >= n or region[f] >= 0:
                return False
        return region[st[-1] % n] < 0 or self._closed_regions

    def _split_part(self, st: tuple[int, ...], words: np.ndarray) -> None:
        """Stack ``st``'s part (:meth:`_split_safe`) in two passes over the vocabulary's two
        tries: the tokens without '"' by plain walks (the top frame's kept per state, its
        continuations as plain walks below their nodes, as in an automaton without counters),
        then the few with '"' as any stack of a counted automaton (counted walks where a
        frame may reach a region)."""
        a = self.automaton
        no_quote, with_quote = self._quote_split()[0]
        top = st[-1]
        n = a.n_states
        s, c = top % n, top // n
        if a._region_list[s] >= 0:  # inside a region these tokens stay there: as a bottom frame's
            words |= self._unquoted_at(s, c)
        else:
            hit = self._ci_plain.get(top)
            if hit is None:
                part = np.zeros(self.n_words, dtype=np.uint32)
                full = count_bytes(a.table, self._cls_sizes, top) >= self.fast_min_bytes
                nodes, states = self._walk_state(no_quote, top, True, part, full)
                part.flags.writeable = False
                hit = _remember(self._ci_plain, top, (part, nodes, states), STATE_MEMO_SIZE)
            part, nodes, states = hit
            words |= part
            if len(nodes):
                self._continue_plain(st[:-1], nodes, states, words, no_quote)
        if self._counted_frame(st):
            nodes, states = with_quote.walk_counted(
                a.table, a.counters, a.cls, s, c, words, self._bnd_inner, loops=self._loops()
            )
        else:
            nodes, states = self._walk_state(with_quote, top, True, words, False)
        if len(nodes):
            self._continue(st[:-1], nodes, states, words, with_quote)

    def _continue_plain(self, base: tuple[int, ...], nodes, states, words: np.ndarray, no_quote) -> None:
        """:meth:`_continue` for tokens without '"' from frames outside every region: plain
        walks where no region is entered or left over another byte (:meth:`_split_safe`),
        else the counted walks as usual."""
        before = self._plain
        self._plain = self._quote_cls >= 0 and not self._bare_any
        try:
            self._continue(base, nodes, states, words, no_quote)
        finally:
            self._plain = before

    def _compute_counted(self, config: int) -> np.ndarray:
        """A row of an automaton with counted repetitions (a walk that carries the count,
        :meth:`VocabIndex.walk_counted`, is exact for every token). A count bound is met by
        a token entering or leaving a region, or starting more items than remain below hi.
        Where hi is out of a token's reach and no bound on a byte other than '"' is near
        (JSON string regions), tokens without '"' meet no bound: their part of the row is
        the usual one (shared with every JSON string), and only the ~0.3% of tokens with
        '"' are walked with the count."""
        a = self.automaton
        n = a.n_states
        s, c = config % n, config // n
        if not self._bare_near(s):
            words = self._unquoted_at(s, c).copy()
            self._quote_split()[0][1].walk_counted(
                a.table, a.counters, a.cls, s, c, words, loops=self._loops()
            )
            return words
        words = np.zeros(self.n_words, dtype=np.uint32)
        self.index.walk_counted(a.table, a.counters, a.cls, s, c, words, loops=self._loops())
        return words

    def _bottom_counted(self, config: int, words: np.ndarray) -> None:
        """Tokens from the bottom frame ``config`` (state + n_states * count) of a pushdown
        automaton with counters, continued through calls: as in :meth:`_compute_counted`,
        the usual walk for tokens without '"' where they meet no bound, the counted walk
        for the others."""
        a = self.automaton
        n = a.n_states
        s, c = config % n, config // n
        if not self._bare_near(s):
            words |= self._unquoted_at(s, c)
            with_quote = self._quote_split()[0][1]
            nodes, states = with_quote.walk_counted(
                a.table, a.counters, a.cls, s, c, words, self._bnd_bottom, loops=self._loops()
            )
            if len(nodes):
                self._continue((), nodes, states, words, with_quote)
            return
        nodes, states = self.index.walk_counted(
            a.table, a.counters, a.cls, s, c, words, self._bnd_bottom, loops=self._loops()
        )
        if len(nodes):
            self._continue((), nodes, states, words, self.index)

    def _loops(self) -> tuple[np.ndarray, np.ndarray]:
        """The automaton's ``counted_loops``, for the counted walks' subtree shortcut (on
        first use)."""
        loops = self.__dict__.get("_loop_sets")
        if loops is None:
            a = self.automaton
            loops = self._loop_sets = counted_loops(a.table, a.counters.act, a.cls, a.counters.region)
        return loops

    def _hi_cap(self, s: int) -> int:
        """Items below hi past which no token from region state ``s`` meets it (the tokens'
        own reach once known, else the bound by their length)."""
        marks = self._caps.get(s)
        if marks is None:
            return self._hi_caps[s]
        return marks[0][-1] if marks[0] else 0  # (the largest margin)

    def _unquoted_at(self, s: int, c: int) -> np.ndarray:
        """The tokens without '"' allowed from state ``s`` at count ``c``, where no byte but
        '"' enters or leaves a region from it (not :meth:`_bare_near`): the row kept per
        state (the same at every count far from hi, and outside regions), or near hi those
        within their margin (:meth:`_near_hi_row`). Do not modify."""
        a = self.automaton
        r = a._region_list[s]
        if r >= 0 and a._hi_list[r] - c < self._hi_cap(s):
            return self._near_hi_row(s, a._hi_list[r] - c)
        return self._unquoted_row(s)

    def _near_hi_row(self, state: int, left: int) -> np.ndarray:
        """The tokens without '"' allowed from region state ``state`` when ``left`` more
        items fit below hi (those whose margin, see ``VocabIndex.walk_crit``, is at most
        ``left``); the margins are kept per state."""
        memo = self.__dict__.setdefault("_crits", {})
        crit = memo.get(state)
        if crit is None:
            a = self.automaton
            crit = np.full(self.vocab_size, np.iinfo(np.int64).max, dtype=np.int64)
            self._quote_split()[0][0].walk_crit(a.table, a.counters, a.cls, state, crit, loops=self._loops())
            _remember(memo, state, crit, MARGIN_MEMO_SIZE)
        bits = np.packbits(crit <= left, bitorder="little")
        words = np.zeros(self.n_words * 4, dtype=np.uint8)
        words[: len(bits)] = bits
        return words.view(np.uint32)

    def _bare_near(self, state: int) -> bool:
        """Can a token without '"' reach, from ``state``, a transition entering or leaving
        a region over another byte? (For every state at once, on first use: a backward
        search from those transitions over the other bytes, as deep as a token.)"""
        near = self._near
        if near is None:
            a, q = self.automaton, self._quote_cls
            tbl = a.table
            if q >= 0:
                tbl = tbl.copy()
                tbl[:, q] = -1
            seen = self._bare.copy()
            if not a.is_regular and seen.any():
                seen[:] = True  # (a call may read any number of bytes: every state is near)
            near = self._near = flags(_within(tbl, seen, self._count_cap))
        return near[state]

    def _counted_frame(self, st: tuple[int, ...]) -> bool:
        """Does the top of stack ``st`` need the walk that carries a count: the bottom frame,
        or a frame from which a token may reach a region (one in a called rule)?"""
        if len(st) == 1:
            return True
        return self._near_region()[st[-1] % self.automaton.n_states]

    def _near_region(self) -> bytes:
        """Per state: may a token reach a counted region from it (on first use)?"""
        near = self.__dict__.get("_to_region")
        if near is None:
            a = self.automaton
            near = self._to_region = flags(_within(a.table, a.counters.region >= 0, self._count_cap))
        return near

    def _unquoted_row(self, state: int) -> np.ndarray:
        """The tokens without '"' allowed from ``state`` by the automaton's table (kept per
        state; a permissive state's is the row shared by its canonical form). In a pushdown
        automaton ``state`` is a bottom frame's, and tokens that call a rule from it are
        continued through the call (a canonical form reaches no call)."""
        memo = self.__dict__.setdefault("_unquoted_rows", {})
        hit = memo.get(state)
        if hit is not None:
            return hit
        a = self.automaton
        (no_quote, _), shared = self._quote_split()
        n_bytes = count_bytes(a.table, self._cls_sizes, state)
        canon = self._permissive_form(state, n_bytes, False)
        hit = shared.get(canon) if canon is not None else None
        if hit is None and canon is None and n_bytes >= PERMISSIVE_BYTES and self._by_length_on:
            hit = self._by_length(state)
        if hit is None:
            hit = np.zeros(self.n_words, dtype=np.uint32)
            self._bottom_walk(no_quote, self._walk_memo(n_bytes >= self.fast_min_bytes), state, hit)
            hit.flags.writeable = False
            if canon is not None:
                _share(shared, canon, hit)
        return _remember(memo, state, hit, STATE_MEMO_SIZE)

    def _by_length(self, state: int) -> np.ndarray | None:
        """The tokens without '"' from ``state`` as a bottom frame, continued through the
        calls they meet (the walk of :meth:`_unquoted_row` and :meth:`_context_independent`),
        in two: those of at most :func:`_short_token_bytes` bytes from :meth:`_short_part`, the
        few longer ones walked. None where :meth:`_short_part` has no part."""
        short, longer = self.vocab.length_split(QUOTE, _short_token_bytes(self.vocab))
        part = self._short_part(state, short)
        if part is None:
            return None
        words = part.copy()
        self._bottom_walk(longer, self._light_memo(), state, words)  # (no shortcut pays)
        words.flags.writeable = False
        return words

    def _bottom_walk(self, trie, memo: WalkMemo, state: int, words: np.ndarray) -> None:
        """The tokens of ``trie`` (without '"') from ``state`` as a bottom frame, into
        ``words``, continued plainly through the calls they meet."""
        nodes, states = trie.walk_fast(memo, False, state, words)
        if len(nodes) and not self.automaton.is_regular:
            self._continue_plain((), nodes, states, words, trie)

    def _short_part(self, state: int, short) -> np.ndarray | None:
        """The tokens without '"' of at most :func:`_short_token_bytes` bytes that ``state``
        (a bottom frame's) allows, continued through calls: kept for every state whose
        search as deep (``rows.near_form``: the states met, their successors by byte class
        but '"', which call a rule, and which may end the grammar) numbers alike, since
        these tokens read no further. Such a search of an unrolled repetition (a string of
        words under ``(\\S+\\s+){0,99}``, each word its own states) finds the same numbering at
        every word far enough from the end. A part is kept with its numbering, under the
        numbering's hash. None when the search meets more than :data:`MAX_NEAR_STATES`
        states."""
        a = self.automaton
        near = self.__dict__.get("_near_scratch")
        if near is None:
            ids = np.arange(a.n_states, dtype=np.int64)  # (a call state: itself; else whether it ends)
            flags = np.where(a.has_calls, ids, -1 - a.accepting.astype(np.int64))
            local = np.full(a.n_states, -1, dtype=np.int64)
            order, dep = (np.empty(MAX_NEAR_STATES, dtype=np.int64) for _ in range(2))
            out = np.empty(MAX_NEAR_STATES * (a.table.shape[1] + 1), dtype=np.int32)
            depth = _short_token_bytes(self.vocab)
            form = bind(
                near_form, a.table, self._quote_cls, flags, depth, MAX_NEAR_STATES, local, order, dep, out
            )
            near = self._near_scratch = (form, out)
        form, out = near
        n, h, w = form(state)
        if n < 0:
            return None
        numbering = out[:w]
        part = self._near_forms.find(h, numbering)
        if part is not None:
            return part
        part = np.zeros(self.n_words, dtype=np.uint32)
        self._bottom_walk(short, self._walk_memo(True), state, part)
        part.flags.writeable = False
        self._near_forms.keep(h, numbering, part, 0)  # (the parts themselves: bounded by count)
        return part

    def _continue(
        self, base: tuple[int, ...], nodes: np.ndarray, states: np.ndarray, words: np.ndarray, trie
    ) -> None:
        """:meth:`_continue_walks` into ``words``, kept (bounded): the bits it sets and the
        stack heights its closures read. The same continuation (a string's closing quote
        returning into the same frames, below the same trie nodes) recurs in the rows of
        every state that reaches it, as each word of an unrolled ``(\\S+\\s+){0,99}`` does; its
        walks only set bits, so its part is the same in any row."""
        key = self._continued_key(base, nodes, states, trie)
        memo = self._continued
        hit = memo.get(key)
        if hit is None:
            lowest, highest = self._lowest, self._highest
            self._lowest, self._highest = 1 << 30, -1
            part = np.zeros(self.n_words, dtype=np.uint32)
            try:
                self._continue_walks([(base, nodes, states)], part, trie)
                hit = (*_set_words(part), self._lowest, self._highest)
            finally:
                self._lowest, self._highest = min(lowest, self._lowest), max(highest, self._highest)
            if len(memo) >= CONTINUATION_MEMO_SIZE:
                memo.clear()
            memo[key] = hit
        at, bits, lowest, highest = hit
        words[at] |= bits
        self._note_reads(lowest, highest)  # (after a walk: already so)

    def _continued_key(self, base: tuple[int, ...], nodes: np.ndarray, states: np.ndarray, trie) -> tuple:
        """What a continuation is kept under (:meth:`_continue`)."""
        return (base, nodes.tobytes(), states.tobytes(), id(trie), self._plain)

    def _continue_walks(self, items: list, words: np.ndarray, trie) -> None:
        """For each ``(base, nodes, states)`` of ``items``: tokens that pass trie
        ``nodes[i]`` with stack ``base + (states[i],)`` and go on through a call or a
        return. Walk those subtrees from every *other* stack of the closure (the caller's
        walk already follows the stack itself). Boundaries that share a state share one
        closure; a stack met in several closures walks below all their nodes at once, and
        stacks that differ only in their top frame walk as one (the reference of
        :meth:`_continue`'s memo)."""
        groups = []
        for base, nodes, states in items:
            distinct = _distinct(states)
            if len(distinct) == 1:  # (mostly one state: a walk through a called rule's return)
                groups.append((base, distinct[0], nodes))
            else:
                groups.extend((base, t, nodes[states == t]) for t in distinct)
        shared: dict[int, tuple] = {}  # closures met, by identity: their roots and stacks
        for base, t, roots in groups:
            stack = base + (t,)
            cfg = self._closure_after(stack)
            if cfg is None:
                continue
            chain = self._chain(stack, cfg, trie.max_depth) if len(cfg[0]) == 2 else None
            if chain is not None:
                self._continue_chain(stack, chain, roots, words, trie)
                continue
            entry = shared.get(id(cfg))
            if entry is None:
                shared[id(cfg)] = (cfg, [roots], [stack])
            else:
                entry[1].append(roots)
                entry[2].append(stack)
        below: dict[tuple[int, ...], list[np.ndarray]] = {}
        for cfg, parts, stacks in shared.values():
            roots = parts[0] if len(parts) == 1 else np.concatenate(parts)
            mine = set(stacks).intersection(cfg[0])  # (a stack its own closure reaches again)
            for st in cfg[0]:
                if st in mine:
                    own = [r for r, s in zip(parts, stacks) if s != st]
                    if own:
                        below.setdefault(st, []).extend(own)
                else:
                    below.setdefault(st, []).append(roots)
        alike: dict[tuple[int, ...], list] = {}  # plain walks by the frames below their top
        for st, parts in below.items():
            roots = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if self._walks_plain(st):
                alike.setdefault(st[:-1], []).append((st[-1], roots))
                continue
            n2, t2 = self._walk_stack(st, roots, words, trie)
            if len(n2):
                self._continue(st[:-1], n2, t2, words, trie)
        for rest, walks in alike.items():
            if len(walks) == 1:
                (top, roots), *_ = walks
                n2, t2 = self._walk_stack(rest + (top,), roots, words, trie)
            else:  # one walk, each root from its own stack's top
                tops = np.array([t for t, _ in walks], dtype=np.int32)
                starts = np.repeat(tops, [len(r) for _, r in walks])
                roots = np.concatenate([r for _, r in walks])
                memo = self._walk_memo(False)
                n2, t2 = trie.walk_fast(memo, bool(rest), int(tops[0]), words, roots, starts=starts)
            if len(n2):
                self._continue(rest, n2, t2, words, trie)

    def _walks_plain(self, st: tuple[int, ...]) -> bool:
        """Does :meth:`_walk_stack` walk stack ``st`` by the plain fast walk (no count
        carried, not the reference walk)? Such walks from stacks that differ only in their
        top frame go as one walk with each root's own start state."""
        return self.fast_min_bytes <= 256 and not self._walks_counted(st)

    def _walks_counted(self, st: tuple[int, ...]) -> bool:
        """Does :meth:`_walk_stack` carry a count walking stack ``st`` (a bottom frame, or a
        region's, of an automaton with counters)?"""
        return self.automaton.counters is not None and not self._plain and self._counted_frame(st)

    def _walk_stack(self, st: tuple[int, ...], roots: np.ndarray, words: np.ndarray, trie, **chain):
        """The walk of stack ``st``'s top below ``roots`` into ``words``: its boundary pairs.
        ``chain``: ``starts`` (each root's own top frame, of a stack of ``st``'s height and
        kind), ``recall`` and ``side`` (a chain of calls), passed to the trie's walk (see
        :meth:`_continue_chain`)."""
        a = self.automaton
        bnd = self._bnd_bottom if len(st) == 1 else self._bnd_inner
        if self._walks_counted(st):
            n = a.n_states  # a bottom frame, or a region's: with its count
            top, count = st[-1] % n, st[-1] // n
            return trie.walk_counted(a.table, a.counters, a.cls, top, count, words, bnd, roots, **chain,
                                     loops=self._loops())  # fmt: skip
        if chain:
            return trie.walk_fast(self._walk_memo(False), len(st) > 1, st[-1], words, roots, **chain)
        if self.fast_min_bytes <= 256:
            return self._walk_below(trie, len(st) > 1, st[-1], roots, words)
        return trie.walk_below(a.table, a.cls, st[-1], bnd, words, roots)  # the reference

    def _closure(self, stack: tuple[int, ...]):
        """The closure of ``stack`` (kept: the same boundaries recur in many rows), its reads
        noted in :attr:`_lowest` and :attr:`_highest`."""
        cfg, lowest, highest = self._closure_kept(stack)
        self._note_reads(lowest, highest)
        return cfg

    def _closure_kept(self, stack: tuple[int, ...]):
        """``closure_reads([stack])``, kept (bounded)."""
        closures = self._closures
        hit = closures.get(stack)
        if hit is None:
            hit = self.automaton.closure_reads([stack])
            if len(closures) >= CLOSURE_MEMO_SIZE:
                closures.clear()
            closures[stack] = hit
        return hit

    def _closure_after(self, stack: tuple[int, ...]):
        """The closure of what ``stack``'s top leads to without reading a byte: the stacks its
        calls push and, where it may end its rule, the frames below (:meth:`_closure`'s
        reads noted). That is the closure of ``stack`` but for ``stack`` itself, which is in
        it where the top reads bytes: a closure is what the stacks reach, so that of several
        stacks is the union of theirs. It is kept under those stacks, one object for every
        top that leads to the same ones, as every state of a run of whitespace before an
        array's item does (calling the item rule with the same return state)."""
        a = self.automaton
        top = stack[-1]
        if a.counters is not None or len(stack) >= pushdown.MAX_STACK_DEPTH:
            return self._closure(stack)
        base = stack[:-1]
        after = tuple(base + (ret, callee) for callee, ret in a.calls[top]) if a._call_flags[top] else ()
        if a._acc_list[top]:
            after += (base,)  # (the bottom frame's end is the empty stack: the grammar's end)
        memo = self._closures
        hit = memo.get(after)
        if hit is None:
            lowest = highest = len(stack)
            cfgs = [((), True)] if () in after else []  # (the bottom frame's end: the grammar's)
            for st in after:
                if st:
                    cfg, lo, hi = self._closure_kept(st)
                    lowest, highest = min(lowest, lo), max(highest, hi)
                    if cfg is not None:
                        cfgs.append(cfg)
            hit = (pushdown.union_config(cfgs) if cfgs else None, lowest, highest)
            if len(memo) >= CLOSURE_MEMO_SIZE:
                memo.clear()
            memo[after] = hit
        self._note_reads(hit[1], hit[2])
        return hit[0]

    def _note_reads(self, lowest: int, highest: int) -> None:
        """Note that walks read the tops of stacks as short as ``lowest`` and as long as
        ``highest`` (:attr:`_lowest`, :attr:`_highest`)."""
        if lowest < self._lowest:
            self._lowest = lowest
        if highest > self._highest:
            self._highest = highest

    def _chain(self, stack: tuple[int, ...], cfg, most: int) -> list | None:
        """The stacks a continuation from ``stack`` = ``(..., b_0, r)`` walks when it is a
        chain of calls of one rule, as a string's characters are where each is an item rule
        called once per position up to the string's maxLength: ``r`` reads no byte (the
        rule's end), and the closure is the caller's frame ``(..., b_0)`` (the side walk)
        and ``st_1 = (..., b_1, y)``, the rule called again (``y``: its start); from
        ``(..., b_k, r)`` the closure is again ``(..., b_k)`` and ``st_{k+1} = (..., b_{k+1},
        y)``. Returns ``[st_1, ..., st_L]`` with 2 <= L <= ``most`` (a level reads a byte at
        least, and a token has at most ``most``), where the side walks are all counted or
        all not; else None (walked level by level as any continuation). The closures it
        reads ahead are noted as read: a row's parts are then kept under a key no shorter
        than its walks need."""
        a = self.automaton
        r = stack[-1]
        if self.fast_min_bytes > 256 or len(stack) < 2 or r >= a.n_states or a._has_bytes_list[r]:
            return None
        side = stack[:-1]
        if side not in cfg[0]:
            return None
        st = _other(cfg[0], side)
        if len(st) != len(stack) or st[:-2] != stack[:-2]:
            return None
        y = st[-1]
        counted = a.counters is not None
        kind = counted and self._counted_frame(side)
        chain = [st]
        while len(chain) < most:
            nxt = chain[-1][:-1] + (r,)
            cfg2 = self._closure(nxt)
            side2 = nxt[:-1]
            if cfg2 is None or len(cfg2[0]) != 2 or side2 not in cfg2[0]:
                break
            other = _other(cfg2[0], side2)
            if len(other) != len(nxt) or other[-1] != y or other[:-2] != nxt[:-2]:
                break
            if (counted and self._counted_frame(side2)) != kind:
                break
            chain.append(other)
        return chain if len(chain) > 1 else None

    def _continue_chain(self, stack: tuple[int, ...], chain: list, roots: np.ndarray, words, trie) -> None:
        """The continuation from ``stack`` through a chain of calls (:meth:`_chain`) in two
        walks, not two a level: the chain's own walk from ``y`` below ``roots``, which goes on
        from ``y`` one level further below each node where it reaches ``r``; then the side
        walks, every level's in one call (below ``roots`` from ``b_0``, below the nodes where
        level k went on from ``b_k``), of those nodes only where ``b_k`` reads a child's
        byte (the chain's walk lists them). The boundaries either walk meets go on as
        continuations: the side walks' from ``stack[:-2]``, level k's from ``st_k[:-1]``."""
        a = self.automaton
        r, st = stack[-1], chain[0]
        b = np.array([stack[-2]] + [s[-2] for s in chain], dtype=np.int64)  # b_0 .. b_L
        # (the side walks' start states, counts left out: which bytes they may read)
        n2, t2, l2, _, (side_roots, side_levels) = self._walk_stack(
            st, roots, words, trie, recall=(r, st[-1], len(chain)), side=b % a.n_states
        )
        if len(side_roots):
            side = stack[:-1]
            sn, ss = self._walk_stack(side, side_roots, words, trie, starts=b[side_levels])
            if len(sn):
                self._continue(side[:-1], sn, ss, words, trie)
        if not len(n2):
            return
        for k in _distinct(l2):
            at = l2 == k
            self._continue(chain[k - 1][:-1], n2[at], t2[at], words, trie)

    def _walk_below(self, trie, inner: bool, state: int, roots: np.ndarray, words: np.ndarray):
        """``trie.walk_fast`` below ``roots`` from ``state``, into ``words``: what it adds
        and the boundaries it returns are kept (bounded), since the same continuation (a
        return into the same state, below the same trie nodes) recurs in the rows of every
        stack that holds it; a walk only sets bits, so its part is the same in any row. A
        walk from another state whose search as deep as the tokens below ``roots`` numbers
        alike (:meth:`_below_form`) takes that walk's part too, its boundary states by their
        numbers: each word of an unrolled ``(\\S+\\s+){0,99}`` returns from a called character
        rule into a state of its own, alike as far as a token reads."""
        key = (state, inner, id(trie), roots.tobytes())
        memo = self._walks_below
        hit = memo.get(key)
        if hit is None:
            form = None
            nodes = trie.fast_nodes[roots]
            if int((nodes[:, F_TOK_END] - nodes[:, F_TOK_LO]).sum()) * BELOW_FORM_SHARE >= self.vocab_size:
                form = self._below_form(trie, inner, state, roots, nodes)
            if form is not None:
                fkey, numbering, order = form
                found = self._below_forms.find(fkey, numbering)
                if found is not None:
                    at, bits, n2, local = found
                    hit = (at, bits, n2, order[local])
            if hit is None:
                part = np.zeros(self.n_words, dtype=np.uint32)
                n2, t2 = trie.walk_fast(self._walk_memo(False), inner, state, part, roots)
                hit = (*_set_words(part), n2, t2)
                if form is not None:
                    self._keep_below_form(form, hit)
            if len(memo) >= CONTINUATION_MEMO_SIZE:
                memo.clear()
            memo[key] = hit
        at, bits, n2, t2 = hit
        words[at] |= bits
        return n2, t2

    def _below_form(self, trie, inner: bool, state: int, roots: np.ndarray, nodes: np.ndarray):
        """What decides a walk of ``trie`` below ``roots`` from ``state`` (a frame above the
        bottom where ``inner``): ``rows.near_form``'s numbering of the states a search from
        ``state`` meets as deep as the tallest subtree below ``roots``, each state's flag
        whether the walk stops there (a boundary of its frame), and its successors by byte
        class (but '"' in a trie without it). Two states that number alike give the same
        walk: the same bits, and boundary states at the same numbers. Returns ``(key,
        numbering, order)`` (``order``: the states by number), None past
        :data:`MAX_NEAR_STATES` states (the numbering and the order are views of scratch
        space, valid until the next call). ``nodes``: the rows of ``roots`` in
        ``trie.fast_nodes``."""
        a = self.automaton
        scratch = self.__dict__.get("_below_scratch")
        if scratch is None:
            bnd = (self._bnd_bottom, self._bnd_inner)
            flags_of = tuple(np.where(b, -3, -1).astype(np.int64) for b in bnd)
            local = np.full(a.n_states, -1, dtype=np.int64)
            order, dep = (np.empty(MAX_NEAR_STATES, dtype=np.int64) for _ in range(2))
            out = np.empty(MAX_NEAR_STATES * (a.table.shape[1] + 1), dtype=np.int32)
            scratch = self._below_scratch = (flags_of, local, order, dep, out)
        flags_of, local, order, dep, out = scratch
        depth = int(nodes[:, F_SUB].max()) >> 8
        split = self._split
        quote = self._quote_cls if split is not None and trie is split[0][0] else -1
        n, h, w = near_form(
            a.table, quote, flags_of[inner], depth, MAX_NEAR_STATES, local, order, dep, out, state
        )
        if n < 0:
            return None
        return (inner, id(trie), roots.tobytes(), quote, h, w), out[:w], order[:n]

    def _keep_below_form(self, form, hit) -> None:
        """Keep walk ``hit`` under its form (:meth:`_below_form`), its boundary states by
        number."""
        fkey, numbering, order = form
        at, bits, n2, t2 = hit
        local = np.empty(len(t2), dtype=np.int64)
        for i, t in enumerate(t2.tolist()):
            where = np.flatnonzero(order == t)
            if not len(where):  # (a boundary past the search: never, as deep as the tokens)
                return
            local[i] = where[0]
        self._below_forms.keep(fkey, numbering, (at, bits, n2, local), at.nbytes + bits.nbytes)

    def remember_step(self, config, token_id: int, nxt):
        """Keep ``nxt`` (None: dead) as the step of ``config`` by ``token_id`` in
        :attr:`step_memo` (at most :data:`STEP_MEMO_SIZE` steps in all, then it starts
        afresh); returns the object kept for ``nxt``. Equal configurations of a pushdown
        automaton are kept as one object, so the memo, the matchers' histories and the row
        cache's keys share them (each is a few tuples)."""
        memo = self.step_memo
        if self._step_entries >= STEP_MEMO_SIZE:
            memo.clear()
            self._step_configs.clear()
            self._step_entries = 0
        if type(nxt) is Config:
            nxt = self._step_configs.setdefault(nxt, nxt)
        row = memo.get(config)
        if row is None:
            if type(config) is Config:
                config = self._step_configs.setdefault(config, config)
            row = memo[config] = {}
        row[token_id] = nxt
        self._step_entries += 1
        return nxt

    def allowed_tokens(self, config) -> np.ndarray:
        """Token ids allowed in ``config`` (for tests and debugging)."""
        return np.nonzero(unpack_bitmask(self.mask_row(config)[None], self.vocab_size)[0])[0]


class _FormMemo:
    """Results kept by the numbering that ``rows.near_form`` writes of their start: under a
    key that holds the numbering's hash, each beside a copy of its numbering, which a lookup
    compares whole. At most ``most`` results and :data:`NEAR_FORM_BYTES` of numberings (and of
    what ``keep`` counts besides), then it starts afresh."""

    __slots__ = ("most", "kept", "count", "nbytes")

    def __init__(self, most: int) -> None:
        self.most = most
        self.kept: dict = {}
        self.count = self.nbytes = 0

    def find(self, key, numbering: np.ndarray):
        """The result kept under ``key`` whose numbering equals ``numbering``, else None."""
        for seen, value in self.kept.get(key, ()):
            if np.array_equal(seen, numbering):
                return value
        return None

    def keep(self, key, numbering: np.ndarray, value, nbytes: int) -> None:
        """Keep ``value`` under ``key`` with a copy of ``numbering``; ``nbytes``: what of
        ``value`` counts towards the bound."""
        nbytes += numbering.nbytes
        if self.count >= self.most or self.nbytes + nbytes > NEAR_FORM_BYTES:
            self.kept.clear()
            self.count = self.nbytes = 0
        self.kept.setdefault(key, []).append((numbering.copy(), value))
        self.count += 1
        self.nbytes += nbytes


def _share(shared: dict, key: bytes, row: np.ndarray) -> None:
    """Keep ``row`` as the shared row of canonical form ``key`` (at most MAX_SHARED_ROWS)."""
    if len(shared) >= MAX_SHARED_ROWS:
        shared.clear()
    shared[key] = row


def _other(stacks: tuple, st: tuple) -> tuple:
    """The stack of two ``stacks`` that is not ``st`` (one of them)."""
    return stacks[1] if stacks[0] == st else stacks[0]


def _distinct(a: np.ndarray) -> list[int]:
    """The values of ``a`` once each, ascending. Its arrays hold a few boundary states: a
    set of their Python ints takes a fraction of a numpy sort's and reduction's call
    overhead (and ``np.unique`` imports numpy.ma on its first call, 10-15 ms that would land
    in some mask)."""
    return sorted(set(a.tolist()))


def _set_words(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the nonzero words of ``part``: a walk's bits, kept sparse. A bool
    array's nonzero is several times faster than an integer array's (about 2 against 8 µs on
    Llama 3's 4,008 words)."""
    at = (part != 0).nonzero()[0]
    return at, part[at]


def _within(table: np.ndarray, seeds: np.ndarray, depth: int) -> np.ndarray:
    """bool [n]: the states of ``table`` (int [n, C], -1 dead) with a path of at most ``depth``
    transitions into a state of ``seeds`` (``dfa_kernels.near_kernel``: a backward search,
    level by level)."""
    return near_kernel(
        np.ascontiguousarray(table, dtype=np.int32), np.ascontiguousarray(seeds, dtype=np.bool_), int(depth)
    )


_COUNTED_WARM: list[bool] = []


def _remember(memo: dict, key, value, most: int):
    """``memo[key] = value`` in a memo of at most ``most`` entries (full: it starts afresh);
    returns ``value``."""
    if len(memo) >= most:
        memo.clear()
    memo[key] = value
    return value


def _short_token_bytes(vocab) -> int:
    """The shortest length of :data:`SHORT_TOKEN_BYTES` that at most :data:`LONG_TOKENS`
    tokens without '"' exceed (the longest listed when none does): 16 bytes for SmolLM2's
    vocabulary, 24 for Llama 3's (kept on the vocabulary)."""
    most = vocab.__dict__.get("_short_token_bytes")
    if most is None:
        t = vocab.split_index(QUOTE)[0]  # (the tokens' lengths: the depths of their nodes)
        lengths = np.repeat(t.node_depth, t.tok_hi - t.tok_lo)
        most = SHORT_TOKEN_BYTES[-1]
        for n in SHORT_TOKEN_BYTES:
            if int((lengths > n).sum()) <= LONG_TOKENS:
                most = n
                break
        vocab.__dict__["_short_token_bytes"] = most
    return most


def _warm_up_counted(index) -> None:
    """Load the counted walk's machine code (numba's disk cache) now, at compile time,
    not at the first mask (~5 ms)."""
    if _COUNTED_WARM:
        return
    table = np.full((1, 1), -1, dtype=np.int32)
    z = np.zeros(1, dtype=np.int64)
    counters = ct.Counters(np.zeros((1, 1), dtype=np.int8), np.full(1, -1, dtype=np.int32), z, z, z)
    words = np.zeros(index.n_words, dtype=np.uint32)
    index.walk_counted(table, counters, np.zeros(256, dtype=np.int32), 0, 0, words, np.zeros(1, dtype=bool))
    _COUNTED_WARM.append(True)


__all__ = ["CompiledConstraint", "Config"]
