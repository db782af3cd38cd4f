/*
 * The native span applier: SpanApplier.ingest()'s loop for the three common kinds.
 *
 * apply() walks a request's observations from `start` and applies each tool, step and model
 * span of a tracked run exactly as guard/server/applier/_applier.py's loop does (the reference): the
 * run's fields and its Touched entry here, the budget, loop-detector and forecaster
 * arithmetic through the policy's record kernels (guard/policy/_speedups.c, called as the
 * policy's functions, never by reaching into its objects). Exactness by refusal: at the first
 * span it does not answer for, it returns that span's index with nothing of it applied, and
 * the Python loop applies that span (and then hands the rest back). It answers for a span
 * that names (guard.run.id) a tracked run of the caller's tenant without a seq gate, and is:
 *   - a tool call with a canonical fingerprint (or none) that the detector's kernel takes;
 *   - a step span with a step index, whose budget the kernel takes;
 *   - a model call of ours (not foreign, no response id, in a run that never saw either),
 *     priced on the span or without a model, with counts and cost the kernel takes;
 *   - the run span of a run whose agent's control stream is up (it only flushes the
 *     request's tool calls into the budgets: the agent's RunEnded is the record).
 * Everything else (foreign spans, response ids, other run spans, unknown or ended runs, other
 * tenants' runs, numbered spans of re-registered runs, refusals and their error texts) is
 * the Python loop's. tests/server/test_applier_native.py holds the two equal by hypothesis.
 *
 * Ownership: the run, its Touched entry and the tenant's Usage are borrowed from the dicts
 * the caller holds (runs, touched, spent); nothing called from here changes those dicts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../../policy/_native_common.h"
#include "../../policy/_slots.h"

enum {
    R_TENANT, R_SEQ_GATE, R_SEEN, R_BUDGET, R_DETECTOR, R_FORECASTER, R_STEP_TOOLS, R_LAST_TOOL,
    R_LAST_ACTION, R_STEP_INPUT, R_STEP_TOKENS, R_GATE_TOKENS, R_STEP_COST, R_GATE_COST,
    R_MODEL, R_LAST_STEP_TOKENS, R_LAST_STEP_COST, R_LAST_STEP, R_SESSION, R_DETACHED_AT,
    R_STOP_REASON, R_SOFT, R_PARENT, R_TOUCHED_AT, R_FORECAST_WARNED, NR
};
static const char *const run_slots[NR] = {
    "tenant", "seq_gate", "seen", "budget", "detector", "forecaster", "step_tools", "last_tool",
    "last_action_hash", "step_input_tokens", "step_tokens", "gate_tokens", "step_cost",
    "gate_cost_usd", "model", "last_step_tokens", "last_step_cost", "last_step", "session",
    "detached_at", "stop_reason", "soft", "parent", "touched_at", "forecast_warned"};
enum { T_PHASE, T_VERDICT, T_TOOLS, T_ATTEMPTS, NT };
enum { U_TOOLS, U_ATTEMPTS, NU }; /* the tenant usage's fields flush() adds to */
static const char *const usage_slots[NU] = {"tool_calls", "tool_attempts"};
static const char *const touched_slots[NT] = {"phase", "verdict", "tools", "attempts"};
/* observation slots, in configure()'s order */
enum {
    O_RUN_ID, O_KIND, O_IN, O_OUT, O_CACHED, O_REASONING, O_COST, O_MODEL, O_RESP_ID,
    O_FOREIGN, O_ACTION_FP, O_RESULT_HASH, O_ATTEMPTS, O_TOOL_NAME, O_STEP_INDEX, O_PROGRESS,
    O_STATE_HASH, NO
};
enum {
    K_BUDGET_STEP, K_BUDGET_MODEL_CALL, K_BUDGET_TOOL_CALLS, K_BUDGET_QUIET, K_LOOP_OBSERVE,
    K_LOOP_END_STEP, K_FORECAST, NK
};

static PyTypeObject *run_type, *touched_type, *usage_type;
static Py_ssize_t off_r[NR], off_tc[NT], off_u[NU], obs_slot[NO], nslots;
static long kind_tool, kind_step, kind_model, kind_run;
static PyObject *after_model, *after_tools, *before_step, *ok_verdict, *kernels[NK];
static PyObject *k_one, *k_zero, *k_zero_f, *s_judge_last, *s_end_step, *s_observe, *s_record_tools,
    *attempts_kwnames, *s_limits, *s_max_tokens, *s_max_cost, *k_span, *s_level, *s_rank,
    *end_step_kwnames;

/* The applier's constants, made by the first configure() (each once: see guard_intern). */
static int constants(void) {
    static const guard_name names[] = {
        {&s_judge_last, "judge_last"}, {&s_end_step, "end_step"}, {&s_observe, "observe"},
        {&s_record_tools, "record_tool_calls"}, {&s_limits, "limits"},
        {&s_max_tokens, "max_tokens"}, {&s_max_cost, "max_cost_usd"}, {&s_level, "level"},
        {&s_rank, "rank"}};
    if (k_one == NULL && (k_one = PyLong_FromLong(1)) == NULL) return -1;
    if (k_zero == NULL && (k_zero = PyLong_FromLong(0)) == NULL) return -1;
    if (k_zero_f == NULL && (k_zero_f = PyFloat_FromDouble(0.0)) == NULL) return -1;
    if (attempts_kwnames == NULL &&
        (attempts_kwnames = Py_BuildValue("(s)", "attempts")) == NULL)
        return -1;
    if (end_step_kwnames == NULL &&
        (end_step_kwnames = Py_BuildValue("(sss)", "state", "progress", "acted")) == NULL)
        return -1;
    return guard_intern(names, Py_ARRAY_LENGTH(names));
}

/* A list's item as a new reference (NULL, no exception, when out of range): the
 * observations and their lists are the caller's, and code run from here may change them. */
static inline PyObject *item_ref(PyObject *list, Py_ssize_t i) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *v = PyList_GetItemRef(list, i);
    if (v == NULL) PyErr_Clear();
    return v;
#else
    PyObject *v = i < PyList_GET_SIZE(list) ? PyList_GetItem(list, i) : NULL;
    return Py_XNewRef(v);
#endif
}

/* configure(RunState, Touched, Usage, slots, nslots, kinds, phases, kernels, ok_verdict, span)
 * slots: the observation's slot indexes in the O_* order; kinds: (tool, step, model, run);
 * phases: (after model call, after tool batch, before step); kernels: the policy's
 * RecordKernels; span: the steps _decisions._forecast_due looks ahead. All or nothing: read
 * and checked (every slot inside nslots) into locals before anything changes. */
static PyObject *sn_configure(PyObject *Py_UNUSED(self), PyObject *const *args,
                              Py_ssize_t nargs) {
    Py_ssize_t i, o_r[NR], o_tc[NT], o_u[NU], o_obs[NO], n;
    long kinds[4];
    if (nargs != 10 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != NO || !PyLong_Check(args[4]) ||
        !PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) != 4 || !PyTuple_Check(args[6]) ||
        PyTuple_GET_SIZE(args[6]) != 3 || !PyTuple_Check(args[7]) ||
        PyTuple_GET_SIZE(args[7]) != NK) {
        PyErr_SetString(PyExc_TypeError, "configure(): bad arguments");
        return NULL;
    }
    for (i = 0; i < NR; i++)
        if (member_offset(args[0], run_slots[i], &o_r[i]) < 0) return NULL;
    for (i = 0; i < NT; i++)
        if (member_offset(args[1], touched_slots[i], &o_tc[i]) < 0) return NULL;
    for (i = 0; i < NU; i++)
        if (member_offset(args[2], usage_slots[i], &o_u[i]) < 0) return NULL;
    n = PyLong_AsSsize_t(args[4]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "configure(): bad nslots");
        return NULL;
    }
    for (i = 0; i < NO; i++) {
        PyObject *v = PyTuple_GET_ITEM(args[3], i);
        o_obs[i] = PyLong_Check(v) ? PyLong_AsSsize_t(v) : -1;
        if (o_obs[i] < 0 || o_obs[i] >= n) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "configure(): bad slot");
            return NULL;
        }
    }
    for (i = 0; i < 4; i++) {
        PyObject *v = PyTuple_GET_ITEM(args[5], i);
        int over;
        kinds[i] = PyLong_Check(v) ? PyLong_AsLongAndOverflow(v, &over) : -1;
        if (!PyLong_Check(v) || over || kinds[i] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "configure(): bad kind");
            return NULL;
        }
    }
    if (constants() < 0) return NULL;
    memcpy(off_r, o_r, sizeof o_r);
    memcpy(off_tc, o_tc, sizeof o_tc);
    memcpy(off_u, o_u, sizeof o_u);
    memcpy(obs_slot, o_obs, sizeof o_obs);
    nslots = n;
    kind_tool = kinds[0], kind_step = kinds[1], kind_model = kinds[2], kind_run = kinds[3];
    Py_XSETREF(run_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(touched_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(usage_type, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(after_model, Py_NewRef(PyTuple_GET_ITEM(args[6], 0)));
    Py_XSETREF(after_tools, Py_NewRef(PyTuple_GET_ITEM(args[6], 1)));
    Py_XSETREF(before_step, Py_NewRef(PyTuple_GET_ITEM(args[6], 2)));
    for (i = 0; i < NK; i++) Py_XSETREF(kernels[i], Py_NewRef(PyTuple_GET_ITEM(args[7], i)));
    Py_XSETREF(ok_verdict, Py_NewRef(args[8]));
    Py_XSETREF(k_span, Py_NewRef(args[9]));
    Py_RETURN_NONE;
}

/* A kernel's answer: 1 taken (its result in *out, a new reference), 0 refused, -1 error.
 * The caller holds every argument (a kernel may run Python code). */
static int kernel(int k, PyObject *const *args, Py_ssize_t n, PyObject **out) {
    PyObject *r = PyObject_Vectorcall(kernels[k], args, n, NULL);
    if (r == NULL) return -1;
    if (r == Py_None) {
        Py_DECREF(r);
        return 0;
    }
    *out = r;
    return 1;
}

/* A verdict's rank into *out: 0, or -1 with an exception. */
static int rank_of(PyObject *verdict, long *out) {
    PyObject *level, *rank;
    long r;
    if (verdict == ok_verdict) {
        *out = 0;
        return 0;
    }
    level = PyObject_GetAttr(verdict, s_level);
    if (level == NULL) return -1;
    rank = PyObject_GetAttr(level, s_rank);
    Py_DECREF(level);
    if (rank == NULL) return -1;
    r = PyLong_AsLong(rank);
    Py_DECREF(rank);
    if (r == -1 && PyErr_Occurred()) return -1;
    *out = r;
    return 0;
}

/* The request's entry of `run`: a new Touched(phase, verdict, tools, attempts) when it has
 * none (0), else the phase set and the verdict kept when stronger (1); -1 on error. *entry
 * is a reference the caller owns (the one created here too). */
static int touch(PyObject *touched, PyObject *run, PyObject **entry, PyObject *phase,
                 PyObject *verdict, PyObject *tools, PyObject *attempts) {
    PyObject *e;
    if (*entry == NULL) { /* Touched(phase, verdict, tools, attempts): its __init__ only sets */
        e = touched_type->tp_alloc(touched_type, 0);
        if (e == NULL) return -1;
        SLOT(e, off_tc[T_PHASE]) = Py_NewRef(phase);
        SLOT(e, off_tc[T_VERDICT]) = Py_NewRef(verdict);
        SLOT(e, off_tc[T_TOOLS]) = Py_NewRef(tools);
        SLOT(e, off_tc[T_ATTEMPTS]) = Py_NewRef(attempts);
        if (PyDict_SetItem(touched, run, e) < 0) {
            Py_DECREF(e);
            return -1;
        }
        *entry = e;
        return 0;
    }
    e = *entry;
    slot_set(e, off_tc[T_PHASE], phase);
    if (tools != k_zero && (slot_add(e, off_tc[T_TOOLS], tools) < 0 ||
                            slot_add(e, off_tc[T_ATTEMPTS], attempts) < 0))
        return -1;
    if (verdict != Py_None) {
        PyObject *have = SLOT(e, off_tc[T_VERDICT]);
        if (have == NULL || have == Py_None) {
            slot_set(e, off_tc[T_VERDICT], verdict);
        } else if (verdict != have && verdict != ok_verdict) {
            long a, b;
            int bad;
            Py_INCREF(have);
            bad = rank_of(verdict, &a) < 0 || rank_of(have, &b) < 0;
            Py_DECREF(have);
            if (bad) return -1;
            if (a > b) slot_set(e, off_tc[T_VERDICT], verdict);
        }
    }
    return 1;
}

/* `v is not None and bool(v)`: 1, 0, or -1 with an exception. */
static int truthy(PyObject *v) { return v == Py_None ? 0 : PyObject_IsTrue(v); }

/* The observation's fields a span's code reads, each a new reference (None when the list is
 * shorter): taken at once, before anything runs that could change the list. */
typedef struct {
    PyObject *f[NO];
} fields;

#define F(x) (sp->f[x])

static void fields_clear(fields *sp) {
    for (int i = 0; i < NO; i++) Py_CLEAR(sp->f[i]);
}

/* A tool span: 1 applied, 0 refused, -1 error. */
static int tool_span(fields *sp, PyObject *run, PyObject *touched, PyObject **entry) {
    PyObject *fp = F(O_ACTION_FP), *attempts = F(O_ATTEMPTS), *name, *verdict, *loop = NULL;
    PyObject *quiet = NULL, *args[3];
    int rc, t;
    t = PyObject_IsTrue(attempts);
    if (t < 0) return -1;
    if (!t) attempts = k_one; /* `o[ATTEMPTS] or 1` */
    t = PyObject_IsTrue(fp);
    if (t < 0) return -1;
    if (t) {
        if ((loop = SLOT(run, off_r[R_DETECTOR])) == NULL) return 0;
        Py_INCREF(loop);
        args[0] = loop, args[1] = fp, args[2] = F(O_RESULT_HASH);
        rc = kernel(K_LOOP_OBSERVE, args, 3, &quiet);
        if (rc <= 0) {
            Py_DECREF(loop);
            return rc;
        }
        if (quiet == Py_True) {
            verdict = Py_NewRef(ok_verdict);
        } else {
            verdict = PyObject_CallMethodNoArgs(loop, s_judge_last);
        }
        Py_DECREF(quiet);
        Py_DECREF(loop);
        if (verdict == NULL) return -1;
    } else {
        verdict = Py_NewRef(Py_None);
    }
    /* the run's fields, as the Python loop sets them (before the detector: nothing reads
     * them in between) */
    if (slot_add(run, off_r[R_STEP_TOOLS], k_one) < 0) goto fail;
    name = F(O_TOOL_NAME);
    t = PyObject_IsTrue(name);
    if (t < 0) goto fail;
    if (t) slot_set(run, off_r[R_LAST_TOOL], name);
    if (verdict != Py_None) slot_set(run, off_r[R_LAST_ACTION], fp); /* fp was truthy */
    if (touch(touched, run, entry, after_tools, verdict, k_one, attempts) < 0) goto fail;
    Py_DECREF(verdict);
    return 1;
fail:
    Py_DECREF(verdict);
    return -1;
}

/* A step span: 1 applied, 0 refused, -1 error. */
static int step_span(fields *sp, PyObject *run, PyObject *usage, PyObject *touched,
                     PyObject **entry) {
    PyObject *index = F(O_STEP_INDEX), *tokens = SLOT(run, off_r[R_STEP_INPUT]);
    PyObject *loop = SLOT(run, off_r[R_DETECTOR]), *fc = SLOT(run, off_r[R_FORECASTER]);
    PyObject *budget = SLOT(run, off_r[R_BUDGET]), *seq = NULL, *verdict = NULL, *done = NULL;
    PyObject *args[4], *v;
    int rc, acted;
    /* what Forecaster.observe() would refuse (after the step is recorded) is the Python
     * loop's; a missing index is too (it reads the budget's steps) */
    if (!PyLong_CheckExact(index) || !tokens || !PyLong_CheckExact(tokens) || !loop || !fc ||
        !budget || !SLOT(run, off_r[R_STEP_TOOLS]) || !SLOT(run, off_r[R_STEP_TOKENS]) ||
        !SLOT(run, off_r[R_STEP_COST]))
        return 0;
    /* (exact ints: these comparisons run no Python code) */
    rc = PyObject_RichCompareBool(index, k_one, Py_GE);
    if (rc <= 0) return rc;
    rc = PyObject_RichCompareBool(tokens, k_zero, Py_GE);
    if (rc <= 0) return rc;
    Py_INCREF(tokens), Py_INCREF(loop), Py_INCREF(fc), Py_INCREF(budget);
    args[0] = budget, args[1] = usage;
    rc = kernel(K_BUDGET_STEP, args, 2, &seq);
    if (rc <= 0) goto out;
    Py_DECREF(seq);
    /* from here the step is recorded: any failure is an error, as in the Python loop */
    args[0] = loop, args[1] = F(O_STATE_HASH), args[2] = F(O_PROGRESS);
    rc = kernel(K_LOOP_END_STEP, args, 3, &verdict);
    if (rc < 0) goto out;
    if (rc == 0) {
        rc = -1;
        if ((v = slot_get(run, off_r[R_STEP_TOOLS])) == NULL) goto out;
        acted = PyObject_RichCompareBool(v, k_zero, Py_GT);
        Py_DECREF(v);
        if (acted < 0) goto out;
        args[1] = F(O_STATE_HASH), args[2] = F(O_PROGRESS);
        args[3] = acted ? Py_True : Py_False;
        args[0] = loop;
        verdict = PyObject_VectorcallMethod(s_end_step, args, 1, end_step_kwnames);
        if (verdict == NULL) goto out;
    }
    args[0] = fc, args[1] = index, args[2] = tokens;
    rc = kernel(K_FORECAST, args, 3, &done);
    if (rc == 0) /* not the kernel's forecaster: its own method (the values are checked) */
        done = PyObject_CallMethodObjArgs(fc, s_observe, index, tokens, NULL);
    rc = -1;
    if (done == NULL) goto out;
    Py_DECREF(done);
    slot_set(run, off_r[R_STEP_INPUT], k_zero);
    if ((v = slot_get(run, off_r[R_STEP_TOKENS])) == NULL) goto out;
    slot_put(run, off_r[R_LAST_STEP_TOKENS], v);
    slot_set(run, off_r[R_STEP_TOKENS], k_zero);
    if ((v = slot_get(run, off_r[R_STEP_COST])) == NULL) goto out;
    slot_put(run, off_r[R_LAST_STEP_COST], v);
    slot_set(run, off_r[R_STEP_COST], k_zero_f);
    slot_set(run, off_r[R_STEP_TOOLS], k_zero);
    slot_set(run, off_r[R_LAST_STEP], index);
    if (touch(touched, run, entry, before_step, verdict, k_zero, k_zero) < 0) goto out;
    rc = 1;
out:
    Py_XDECREF(verdict);
    Py_DECREF(tokens), Py_DECREF(loop), Py_DECREF(fc), Py_DECREF(budget);
    return rc;
}

/* A model span: 1 applied, 0 refused, -1 error. */
static int model_span(fields *sp, PyObject *run, PyObject *usage, PyObject *touched,
                      PyObject **entry) {
    PyObject *model = F(O_MODEL), *cost = F(O_COST), *in = F(O_IN), *budget;
    PyObject *out = F(O_OUT), *seq = NULL, *total, *args[7];
    int rc, has_model;
    if ((rc = truthy(F(O_FOREIGN))) != 0 || (rc = truthy(F(O_RESP_ID))) != 0)
        return rc < 0 ? -1 : 0; /* a possible repeat: SeenCalls is the Python loop's */
    if (SLOT(run, off_r[R_SEEN]) != Py_None) return 0;
    has_model = PyObject_IsTrue(model);
    if (has_model < 0) return -1;
    if (cost == Py_None && has_model) return 0; /* priced by the policy's price book */
    if (!SLOT(run, off_r[R_BUDGET]) || !SLOT(run, off_r[R_STEP_INPUT]) ||
        !SLOT(run, off_r[R_STEP_TOKENS]) || !SLOT(run, off_r[R_GATE_TOKENS]) ||
        !SLOT(run, off_r[R_STEP_COST]) || !SLOT(run, off_r[R_GATE_COST]))
        return 0;
    budget = Py_NewRef(SLOT(run, off_r[R_BUDGET]));
    args[0] = budget, args[1] = usage, args[2] = in, args[3] = out;
    args[4] = F(O_REASONING), args[5] = F(O_CACHED), args[6] = cost;
    rc = kernel(K_BUDGET_MODEL_CALL, args, 7, &seq);
    Py_DECREF(budget);
    if (rc <= 0) return rc;
    Py_DECREF(seq);
    total = PyNumber_Add(in, out);
    if (total == NULL) return -1;
    rc = slot_add(run, off_r[R_STEP_INPUT], in) < 0 ||
         slot_add(run, off_r[R_STEP_TOKENS], total) < 0 ||
         slot_add(run, off_r[R_GATE_TOKENS], total) < 0;
    Py_DECREF(total);
    if (rc) return -1;
    if (cost != Py_None && (slot_add(run, off_r[R_STEP_COST], cost) < 0 ||
                            slot_add(run, off_r[R_GATE_COST], cost) < 0))
        return -1;
    if (has_model) slot_set(run, off_r[R_MODEL], model);
    return touch(touched, run, entry, after_model, Py_None, k_zero, k_zero) < 0 ? -1 : 1;
}

#include "_apply_end.h" /* flush() and conclude(): the request's end */

/* apply(observations, start, touched, spent, runs, scope) -> the index of the first span
 * not applied (len(observations) when all were).
 * Every object read here is held (a new reference) across the calls that can run Python
 * code: the observation and its fields, the run, its Touched entry and its tenant's Usage
 * (the dicts hold them too, unless a callback changes the dicts). */
static PyObject *sn_apply(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    PyObject *obs, *touched, *spent, *runs, *scope;
    PyObject *cur = NULL, *last_id = NULL, *usage = NULL, *entry = NULL, *res = NULL;
    fields sp;
    Py_ssize_t i;
    int j;
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2]) ||
        !PyDict_CheckExact(args[3]) || !PyDict_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "apply(list, start, dict, dict, dict, scope)");
        return NULL;
    }
    if (run_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "apply() before configure()");
        return NULL;
    }
    obs = args[0], touched = args[2], spent = args[3], runs = args[4], scope = args[5];
    if (!PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "apply(): start must be an int");
        return NULL;
    }
    i = PyLong_AsSsize_t(args[1]);
    if (i < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "apply(): start < 0");
        return NULL;
    }
    for (j = 0; j < NO; j++) sp.f[j] = NULL;
    for (;; i++) {
        PyObject *o, *rid, *run, *kind;
        long k;
        int rc, over;
        fields_clear(&sp);
        if ((o = item_ref(obs, i)) == NULL) break; /* the end (the list may have shrunk) */
        if (!PyList_Check(o) || PyList_GET_SIZE(o) < nslots) {
            Py_DECREF(o);
            break;
        }
        for (j = 0; j < NO; j++)
            if ((sp.f[j] = item_ref(o, obs_slot[j])) == NULL) sp.f[j] = Py_NewRef(Py_None);
        Py_DECREF(o);
        rid = sp.f[O_RUN_ID];
        if (!PyUnicode_CheckExact(rid) || PyUnicode_GET_LENGTH(rid) == 0) break;
        if (rid == last_id || (last_id != NULL && PyUnicode_Compare(rid, last_id) == 0)) {
            run = cur;
        } else {
            run = PyDict_GetItemWithError(runs, rid); /* exact str: no code runs */
            if (run == NULL) {
                if (PyErr_Occurred()) goto error;
                break;
            }
            if (run != cur) {
                PyObject *tenant, *u, *e;
                if (!Py_IS_TYPE(run, run_type)) break;
                tenant = SLOT(run, off_r[R_TENANT]);
                if (tenant == NULL || !PyUnicode_CheckExact(tenant)) break;
                if (scope != Py_None && (!PyUnicode_CheckExact(scope) ||
                                         PyUnicode_Compare(tenant, scope) != 0))
                    break; /* another tenant's run: the Python loop answers it */
                if (SLOT(run, off_r[R_SEQ_GATE]) != Py_None) break;
                Py_INCREF(run), Py_INCREF(tenant);
                u = PyDict_GetItemWithError(spent, tenant);
                if (u == NULL) {
                    if (PyErr_Occurred() ||
                        (u = PyObject_CallNoArgs((PyObject *)usage_type)) == NULL ||
                        PyDict_SetItem(spent, tenant, u) < 0) {
                        Py_XDECREF(u);
                        Py_DECREF(run), Py_DECREF(tenant);
                        goto error;
                    }
                } else {
                    Py_INCREF(u);
                }
                Py_DECREF(tenant);
                if (!Py_IS_TYPE(u, usage_type)) {
                    Py_DECREF(u), Py_DECREF(run);
                    break;
                }
                e = PyDict_GetItemWithError(touched, run); /* (RunState: identity hash) */
                if (e == NULL && PyErr_Occurred()) {
                    Py_DECREF(u), Py_DECREF(run);
                    goto error;
                }
                if (e != NULL && !Py_IS_TYPE(e, touched_type)) {
                    Py_DECREF(u), Py_DECREF(run);
                    break;
                }
                Py_XSETREF(entry, Py_XNewRef(e));
                Py_XSETREF(usage, u);
                Py_XSETREF(cur, run);
            }
            Py_XSETREF(last_id, Py_NewRef(rid));
        }
        run = cur;
        kind = sp.f[O_KIND];
        k = PyLong_CheckExact(kind) ? PyLong_AsLongAndOverflow(kind, &over) : -1;
        if (PyLong_CheckExact(kind) && over) k = -1; /* (no kind is that large) */
        if (k == -1) rc = 0;
        else if (k == kind_tool) rc = tool_span(&sp, run, touched, &entry);
        else if (k == kind_step) rc = step_span(&sp, run, usage, touched, &entry);
        else if (k == kind_model) rc = model_span(&sp, run, usage, touched, &entry);
        else if (k == kind_run && SLOT(run, off_r[R_SESSION]) != NULL &&
                 SLOT(run, off_r[R_SESSION]) != Py_None &&
                 SLOT(run, off_r[R_DETACHED_AT]) == Py_None) {
            /* the run span of a run whose agent's stream is up: its RunEnded is the record,
             * so the span only completes the budgets (_ingest._run_span) */
            if (flush(touched, spent) < 0) goto error;
            Py_CLEAR(cur);
            Py_CLEAR(last_id);
            Py_CLEAR(entry);
            Py_CLEAR(usage);
            continue;
        } else rc = 0;
        if (rc < 0) goto error;
        if (rc == 0) break;
    }
    res = PyLong_FromSsize_t(i);
error:
    fields_clear(&sp);
    Py_XDECREF(cur), Py_XDECREF(last_id), Py_XDECREF(usage), Py_XDECREF(entry);
    return res;
}

static PyMethodDef methods[] = {
    GUARD_FASTCALL("configure", sn_configure,
        "configure(RunState, Touched, Usage, slots, nslots, kinds, phases, kernels, ok)"),
    GUARD_FASTCALL("flush", sn_flush,
        "flush(touched, spent) -> None: the tool calls counted in touched, into the budgets"),
    GUARD_FASTCALL("conclude", sn_conclude,
        "conclude(touched, now, decide) -> None: decide(run, entry) for each run that may act"),
    GUARD_FASTCALL("apply", sn_apply,
        "apply(observations, start, touched, spent, runs, scope) -> first index not applied"),
    {NULL, NULL, 0, NULL}};

/* Multi-phase initialisation (PEP 489). The configuration (configure(), called once by
 * guard/server/applier/_nativeapply.py) is process-wide, so the module is one per process: not loaded
 * into subinterpreters, and it keeps the GIL (3.13 free threading). */
static PyModuleDef_Slot module_slots[] = {GUARD_SLOTS_ONE_PER_PROCESS {0, NULL}};

GUARD_MODULE(_applynative, "The native span applier of guard.server.applier.", methods,
             module_slots)
