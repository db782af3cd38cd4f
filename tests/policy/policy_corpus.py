"""A labelled corpus of agent traces for the loop and stagnation detector.

Written by hand from the runaway patterns in DESIGN §1 and the seeds (003: the refund bot that
alternates order_query/kb_search with shifting arguments and always gets an empty result;
000 §8: exact repeats, "天气 杭州" rephrasings, read -> edit -> test cycles). ``label`` is what a
careful human reviewer would say: ``loop`` (the run should be stopped) or ``legit`` (it must not
be). ``hard`` marks legitimate traces that a fingerprint detector cannot tell from a loop
without more signal (kept in the corpus so the false-positive figure stays honest).
``policy_corpus_reread.py`` adds mixed traces: a lookup re-read alongside new work (legit) and
its near misses (loops). ``polling`` tags the traces that poll a job's status:
``benchmarks/loop_corpus.py --frameworks`` declares their repeated tool a poll tool, where the
SDK offers a way to declare one.

Shared by ``tests/policy/test_policy_corpus.py`` and ``benchmarks/loop_corpus.py``.
"""

from policy_corpus_base import Call, Step, Trace, TraceResult, run_trace
from policy_corpus_legit import LEGIT
from policy_corpus_loops import LOOPS
from policy_corpus_reread import REREAD_LEGIT, REREAD_LOOPS

__all__ = ["CORPUS", "LEGIT", "LOOPS", "Call", "Step", "Trace", "TraceResult", "run_trace"]

CORPUS: list[Trace] = LOOPS + REREAD_LOOPS + LEGIT + REREAD_LEGIT
