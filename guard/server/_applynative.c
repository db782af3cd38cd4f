/*
 * The native span applier: SpanApplier.ingest()'s loop for the three common kinds.
 *
 * apply() walks a request's observations from `start` and applies each tool, step and model
 * span of a tracked run exactly as guard/server/_ingest.py's loop does (the reference): the
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

#include "../policy/_slots.h"

enum {
    R_TENANT, R_SEQ_GATE, R_SEEN, R_BUDGET, R_LOOP, R_FORECASTER, R_STEP_TOOLS, R_LAST_TOOL,
    R_LAST_ACTION, R_STEP_INPUT, R_STEP_TOKENS, R_TOKENS_USED, R_STEP_COST, R_COST_USED,
    R_MODEL, R_LAST_STEP_TOKENS, R_LAST_STEP_COST, R_LAST_STEP, R_SESSION, R_DETACHED_AT,
    R_STOP_REASON, R_SOFT, R_PARENT, R_TOUCHED_AT, R_FORECAST_WARNED, NR
};
static const char *const run_slots[NR] = {
    "tenant", "seq_gate", "seen", "budget", "loop", "forecaster", "step_tools", "last_tool",
    "last_action_hash", "step_input_tokens", "step_tokens", "tokens_used", "step_cost",
    "cost_used", "model", "last_step_tokens", "last_step_cost", "last_step", "session",
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

#define OBS(o, i) PyList_GET_ITEM((o), obs_slot[i])

/* configure(RunState, Touched, Usage, slots, nslots, kinds, phases, kernels, ok_verdict, span)
 * slots: the observation's slot indexes in the O_* order; kinds: (tool, step, model, run);
 * phases: (after model call, after tool batch, before step); kernels: the policy's
 * RecordKernels; span: the steps _decisions._forecast_due looks ahead. */
static PyObject *sn_configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t i;
    if (nargs != 10 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != NO || !PyTuple_Check(args[5]) ||
        PyTuple_GET_SIZE(args[5]) != 4 || !PyTuple_Check(args[6]) ||
        PyTuple_GET_SIZE(args[6]) != 3 || !PyTuple_Check(args[7]) ||
        PyTuple_GET_SIZE(args[7]) != NK) {
        PyErr_SetString(PyExc_TypeError, "configure(): bad arguments");
        return NULL;
    }
    for (i = 0; i < NR; i++)
        if (member_offset(args[0], run_slots[i], &off_r[i]) < 0) return NULL;
    for (i = 0; i < NT; i++)
        if (member_offset(args[1], touched_slots[i], &off_tc[i]) < 0) return NULL;
    for (i = 0; i < NU; i++)
        if (member_offset(args[2], usage_slots[i], &off_u[i]) < 0) return NULL;
    nslots = PyLong_AsSsize_t(args[4]);
    for (i = 0; i < NO; i++) {
        obs_slot[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[3], i));
        if (obs_slot[i] < 0 || obs_slot[i] >= nslots) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "configure(): bad slot");
            return NULL;
        }
    }
    kind_tool = PyLong_AsLong(PyTuple_GET_ITEM(args[5], 0));
    kind_step = PyLong_AsLong(PyTuple_GET_ITEM(args[5], 1));
    kind_model = PyLong_AsLong(PyTuple_GET_ITEM(args[5], 2));
    kind_run = PyLong_AsLong(PyTuple_GET_ITEM(args[5], 3));
    if (PyErr_Occurred()) return NULL;
    if (k_one == NULL) {
        k_one = PyLong_FromLong(1);
        k_zero = PyLong_FromLong(0);
        k_zero_f = PyFloat_FromDouble(0.0);
        s_judge_last = PyUnicode_InternFromString("judge_last");
        s_end_step = PyUnicode_InternFromString("end_step");
        s_observe = PyUnicode_InternFromString("observe");
        s_record_tools = PyUnicode_InternFromString("record_tool_calls");
        s_limits = PyUnicode_InternFromString("limits");
        s_max_tokens = PyUnicode_InternFromString("max_tokens");
        s_max_cost = PyUnicode_InternFromString("max_cost_usd");
        if (!s_limits || !s_max_tokens || !s_max_cost) return NULL;
        attempts_kwnames = Py_BuildValue("(s)", "attempts");
        s_level = PyUnicode_InternFromString("level");
        s_rank = PyUnicode_InternFromString("rank");
        end_step_kwnames = Py_BuildValue("(sss)", "state", "progress", "acted");
        if (!k_one || !k_zero || !k_zero_f || !s_judge_last || !s_end_step || !s_observe || !s_record_tools || !attempts_kwnames || !s_level ||
            !s_rank || !end_step_kwnames)
            return NULL;
    }
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

/* A kernel's answer: 1 taken (its result in *out, a new reference), 0 refused, -1 error. */
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

static long rank_of(PyObject *verdict) {
    PyObject *level, *rank;
    long r;
    if (verdict == ok_verdict) return 0;
    level = PyObject_GetAttr(verdict, s_level);
    if (level == NULL) return -1;
    rank = PyObject_GetAttr(level, s_rank);
    Py_DECREF(level);
    if (rank == NULL) return -1;
    r = PyLong_AsLong(rank);
    Py_DECREF(rank);
    return r;
}

/* The request's entry of `run`: a new Touched(phase, verdict, tools, attempts) when it has
 * none (0), else the phase set and the verdict kept when stronger (1); -1 on error. */
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
        Py_DECREF(e); /* the dict holds it */
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
            long a = rank_of(verdict), b = rank_of(have);
            if (a < 0 || b < 0) return -1;
            if (a > b) slot_set(e, off_tc[T_VERDICT], verdict);
        }
    }
    return 1;
}

static int truthy(PyObject *v) { return v != Py_None && PyObject_IsTrue(v); }

/* A tool span: 1 applied, 0 refused, -1 error. */
static int tool_span(PyObject *o, PyObject *run, PyObject *touched, PyObject **entry) {
    PyObject *fp = OBS(o, O_ACTION_FP), *attempts = OBS(o, O_ATTEMPTS), *name, *verdict;
    PyObject *quiet = NULL, *args[3];
    int rc, t;
    t = PyObject_IsTrue(attempts);
    if (t < 0) return -1;
    if (!t) attempts = k_one; /* `o[ATTEMPTS] or 1` */
    t = PyObject_IsTrue(fp);
    if (t < 0) return -1;
    if (t) {
        args[0] = SLOT(run, off_r[R_LOOP]), args[1] = fp, args[2] = OBS(o, O_RESULT_HASH);
        if (args[0] == NULL) return 0;
        rc = kernel(K_LOOP_OBSERVE, args, 3, &quiet);
        if (rc <= 0) return rc;
        if (quiet == Py_True) {
            verdict = Py_NewRef(ok_verdict);
        } else {
            verdict = PyObject_CallMethodNoArgs(args[0], s_judge_last);
            if (verdict == NULL) {
                Py_DECREF(quiet);
                return -1;
            }
        }
        Py_DECREF(quiet);
    } else {
        verdict = Py_NewRef(Py_None);
    }
    /* the run's fields, as the Python loop sets them (before the detector: nothing reads
     * them in between) */
    if (slot_add(run, off_r[R_STEP_TOOLS], k_one) < 0) goto fail;
    name = OBS(o, O_TOOL_NAME);
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
static int step_span(PyObject *o, PyObject *run, PyObject *usage, PyObject *touched,
                     PyObject **entry) {
    PyObject *index = OBS(o, O_STEP_INDEX), *tokens = SLOT(run, off_r[R_STEP_INPUT]);
    PyObject *loop = SLOT(run, off_r[R_LOOP]), *fc = SLOT(run, off_r[R_FORECASTER]);
    PyObject *budget = SLOT(run, off_r[R_BUDGET]), *seq = NULL, *verdict = NULL, *done = NULL;
    PyObject *args[4];
    int rc, acted;
    /* what Forecaster.observe() would refuse (after the step is recorded) is the Python
     * loop's; a missing index is too (it reads the budget's steps) */
    if (!PyLong_CheckExact(index) || !tokens || !PyLong_CheckExact(tokens) || !loop || !fc ||
        !budget || !SLOT(run, off_r[R_STEP_TOOLS]) || !SLOT(run, off_r[R_STEP_TOKENS]) ||
        !SLOT(run, off_r[R_STEP_COST]))
        return 0;
    rc = PyObject_RichCompareBool(index, k_one, Py_GE);
    if (rc <= 0) return rc;
    rc = PyObject_RichCompareBool(tokens, k_zero, Py_GE);
    if (rc <= 0) return rc;
    args[0] = budget, args[1] = usage;
    rc = kernel(K_BUDGET_STEP, args, 2, &seq);
    if (rc <= 0) return rc;
    Py_DECREF(seq);
    /* from here the step is recorded: any failure is an error, as in the Python loop */
    args[0] = loop, args[1] = OBS(o, O_STATE_HASH), args[2] = OBS(o, O_PROGRESS);
    rc = kernel(K_LOOP_END_STEP, args, 3, &verdict);
    if (rc < 0) return -1;
    if (rc == 0) {
        acted = PyObject_RichCompareBool(SLOT(run, off_r[R_STEP_TOOLS]), k_zero, Py_GT);
        if (acted < 0) return -1;
        args[1] = OBS(o, O_STATE_HASH), args[2] = OBS(o, O_PROGRESS);
        args[3] = acted ? Py_True : Py_False;
        args[0] = loop;
        verdict = PyObject_VectorcallMethod(s_end_step, args, 1, end_step_kwnames);
        if (verdict == NULL) return -1;
    }
    args[0] = fc, args[1] = index, args[2] = tokens;
    rc = kernel(K_FORECAST, args, 3, &done);
    if (rc == 0) /* not the kernel's forecaster: its own method (the values are checked) */
        done = PyObject_CallMethodObjArgs(fc, s_observe, index, tokens, NULL);
    if (rc < 0 || done == NULL) goto fail;
    Py_DECREF(done);
    slot_set(run, off_r[R_STEP_INPUT], k_zero);
    slot_set(run, off_r[R_LAST_STEP_TOKENS], SLOT(run, off_r[R_STEP_TOKENS]));
    slot_set(run, off_r[R_STEP_TOKENS], k_zero);
    slot_set(run, off_r[R_LAST_STEP_COST], SLOT(run, off_r[R_STEP_COST]));
    slot_set(run, off_r[R_STEP_COST], k_zero_f);
    slot_set(run, off_r[R_STEP_TOOLS], k_zero);
    slot_set(run, off_r[R_LAST_STEP], index);
    if (touch(touched, run, entry, before_step, verdict, k_zero, k_zero) < 0) goto fail;
    Py_DECREF(verdict);
    return 1;
fail:
    Py_DECREF(verdict);
    return -1;
}

/* A model span: 1 applied, 0 refused, -1 error. */
static int model_span(PyObject *o, PyObject *run, PyObject *usage, PyObject *touched,
                      PyObject **entry) {
    PyObject *model = OBS(o, O_MODEL), *cost = OBS(o, O_COST), *in = OBS(o, O_IN);
    PyObject *out = OBS(o, O_OUT), *seq = NULL, *total, *args[7];
    int rc, has_model;
    if (truthy(OBS(o, O_FOREIGN)) || truthy(OBS(o, O_RESP_ID)) ||
        SLOT(run, off_r[R_SEEN]) != Py_None)
        return 0; /* a possible repeat: SeenCalls is the Python loop's */
    has_model = PyObject_IsTrue(model);
    if (has_model < 0) return -1;
    if (cost == Py_None && has_model) return 0; /* priced by the policy's price book */
    if (!SLOT(run, off_r[R_BUDGET]) || !SLOT(run, off_r[R_STEP_INPUT]) ||
        !SLOT(run, off_r[R_STEP_TOKENS]) || !SLOT(run, off_r[R_TOKENS_USED]) ||
        !SLOT(run, off_r[R_STEP_COST]) || !SLOT(run, off_r[R_COST_USED]))
        return 0;
    args[0] = SLOT(run, off_r[R_BUDGET]), args[1] = usage, args[2] = in, args[3] = out;
    args[4] = OBS(o, O_REASONING), args[5] = OBS(o, O_CACHED), args[6] = cost;
    rc = kernel(K_BUDGET_MODEL_CALL, args, 7, &seq);
    if (rc <= 0) return rc;
    Py_DECREF(seq);
    total = PyNumber_Add(in, out);
    if (total == NULL) return -1;
    rc = slot_add(run, off_r[R_STEP_INPUT], in) < 0 ||
         slot_add(run, off_r[R_STEP_TOKENS], total) < 0 ||
         slot_add(run, off_r[R_TOKENS_USED], total) < 0;
    Py_DECREF(total);
    if (rc) return -1;
    if (cost != Py_None && (slot_add(run, off_r[R_STEP_COST], cost) < 0 ||
                            slot_add(run, off_r[R_COST_USED], cost) < 0))
        return -1;
    if (has_model) slot_set(run, off_r[R_MODEL], model);
    return touch(touched, run, entry, after_model, Py_None, k_zero, k_zero) < 0 ? -1 : 1;
}

#include "_apply_end.h" /* flush() and conclude(): the request's end */

/* apply(observations, start, touched, spent, runs, scope) -> the index of the first span
 * not applied (len(observations) when all were). */
static PyObject *sn_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *obs, *touched, *spent, *runs, *scope;
    PyObject *cur = NULL, *last_id = NULL, *usage = NULL, *entry = NULL;
    Py_ssize_t i, n;
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
    i = PyLong_AsSsize_t(args[1]);
    if (i < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "apply(): start < 0");
        return NULL;
    }
    n = PyList_GET_SIZE(obs);
    for (; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(obs, i), *rid, *run, *kind;
        long k;
        int rc;
        if (!PyList_Check(o) || PyList_GET_SIZE(o) < nslots) break;
        rid = OBS(o, O_RUN_ID);
        if (!PyUnicode_CheckExact(rid) || PyUnicode_GET_LENGTH(rid) == 0) break;
        if (rid == last_id || (last_id != NULL && PyUnicode_Compare(rid, last_id) == 0)) {
            run = cur;
        } else {
            run = PyDict_GetItemWithError(runs, rid);
            if (run == NULL) {
                if (PyErr_Occurred()) return NULL;
                break;
            }
            if (run != cur) {
                PyObject *tenant;
                if (!Py_IS_TYPE(run, run_type)) break;
                tenant = SLOT(run, off_r[R_TENANT]);
                if (tenant == NULL || !PyUnicode_CheckExact(tenant)) break;
                if (scope != Py_None && (!PyUnicode_CheckExact(scope) ||
                                         PyUnicode_Compare(tenant, scope) != 0))
                    break; /* another tenant's run: the Python loop answers it */
                if (SLOT(run, off_r[R_SEQ_GATE]) != Py_None) break;
                usage = PyDict_GetItemWithError(spent, tenant);
                if (usage == NULL) {
                    if (PyErr_Occurred()) return NULL;
                    usage = PyObject_CallNoArgs((PyObject *)usage_type);
                    if (usage == NULL) return NULL;
                    rc = PyDict_SetItem(spent, tenant, usage);
                    Py_DECREF(usage); /* the dict holds it */
                    if (rc < 0) return NULL;
                }
                if (!Py_IS_TYPE(usage, usage_type)) break;
                entry = PyDict_GetItemWithError(touched, run);
                if (entry == NULL && PyErr_Occurred()) return NULL;
                if (entry != NULL && !Py_IS_TYPE(entry, touched_type)) break;
                cur = run;
            }
            last_id = rid;
        }
        kind = OBS(o, O_KIND);
        k = PyLong_CheckExact(kind) ? PyLong_AsLong(kind) : -1;
        if (k == kind_tool) rc = tool_span(o, run, touched, &entry);
        else if (k == kind_step) rc = step_span(o, run, usage, touched, &entry);
        else if (k == kind_model) rc = model_span(o, run, usage, touched, &entry);
        else if (k == kind_run && SLOT(run, off_r[R_SESSION]) != NULL &&
                 SLOT(run, off_r[R_SESSION]) != Py_None &&
                 SLOT(run, off_r[R_DETACHED_AT]) == Py_None) {
            /* the run span of a run whose agent's stream is up: its RunEnded is the record,
             * so the span only completes the budgets (_ingest._run_span) */
            if (flush(touched, spent) < 0) return NULL;
            cur = last_id = NULL;
            continue;
        } else rc = 0;
        if (rc < 0) return NULL;
        if (rc == 0) break;
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))sn_configure, METH_FASTCALL,
     "configure(RunState, Touched, Usage, slots, nslots, kinds, phases, kernels, ok)"},
    {"flush", (PyCFunction)(void (*)(void))sn_flush, METH_FASTCALL,
     "flush(touched, spent) -> None: the tool calls counted in touched, into the budgets"},
    {"conclude", (PyCFunction)(void (*)(void))sn_conclude, METH_FASTCALL,
     "conclude(touched, now, decide) -> None: decide(run, entry) for each run that may act"},
    {"apply", (PyCFunction)(void (*)(void))sn_apply, METH_FASTCALL,
     "apply(observations, start, touched, spent, runs, scope) -> first index not applied"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "_applynative",
                                    "The native span applier of guard.server._ingest.",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__applynative(void) { return PyModule_Create(&module); }
