/* Part of _otlpnative.c (included once, after its configuration globals: one translation
 * unit, so everything stays static).
 *
 * One span: its attributes read into the observation's slots (the reference's key table and
 * value rules), its kind classified as the reference's _observe does, and the Observation
 * built. Every function returns 0 (done), -1 (fall back: a span the reference decides) or -2
 * (a Python error is set). */
#ifndef OTLP_SPAN_H
#define OTLP_SPAN_H

/* ---- a cache of the strings that repeat from span to span ---------------------------------
 * Agents repeat most string attributes verbatim on every span (run id, tenant, operation,
 * model, tool name): a direct-mapped cache of their str objects by exact bytes saves a decode
 * and an allocation per attribute. Per-call values (fingerprints, hashes, response ids) are
 * not cached (they never repeat); see configure()'s `unique` slots. Entries hold a reference
 * to the str and a copy of the bytes (short values only). */
#define CACHE_SIZE 4096
#define CACHE_MAX_LEN 96
typedef struct {
    PyObject *value; /* NULL = empty */
    Py_ssize_t len;
    char bytes[CACHE_MAX_LEN];
} cached_str;
static cached_str cache[CACHE_SIZE];
static unsigned char unique_slot[MAX_SLOTS]; /* slots whose values are never cached */

static PyObject *string_of(const unsigned char *s, Py_ssize_t n, int slot) {
    if (n > CACHE_MAX_LEN || unique_slot[slot])
        return PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    cached_str *c = &cache[hash_bytes((const char *)s, n) & (CACHE_SIZE - 1)];
    if (c->value != NULL && c->len == n && memcmp(c->bytes, s, (size_t)n) == 0) {
        Py_INCREF(c->value);
        return c->value;
    }
    PyObject *v = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    if (v == NULL)
        return NULL;
    Py_INCREF(v);
    Py_XSETREF(c->value, v);
    c->len = n;
    memcpy(c->bytes, s, (size_t)n);
    return v;
}

/* ---- one span -------------------------------------------------------------------------- */
typedef struct {
    PyObject *slot[MAX_SLOTS]; /* owned references or NULL (None) */
    const unsigned char *str[MAX_SLOTS]; /* the UTF-8 bytes of string slots */
    Py_ssize_t strlen_[MAX_SLOTS];
    int known; /* any attribute we read */
} obs;

static void obs_clear(obs *o) {
    for (int i = 0; i < nslots; i++)
        Py_CLEAR(o->slot[i]);
    o->known = 0;
}

static inline void obs_set(obs *o, int slot, PyObject *v) {
    Py_XSETREF(o->slot[slot], v);
}

/* One span attribute (an encoded KeyValue). 0: read or skipped; -1: fall back; -2: error set. */
static int attribute(const unsigned char *p, Py_ssize_t n, obs *o, int depth) {
    rd r = {p, p + n};
    const unsigned char *key = (const unsigned char *)"", *val = NULL;
    Py_ssize_t key_len = 0, val_len = 0;
    int values = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        if (wire_tag(&r, &tag) < 0)
            return -1;
        if (tag == 0x0A) { /* 1: key (the last one counts) */
            if (utf8_field(&r, &key, &key_len) < 0)
                return -1;
        } else if (tag == 0x12) { /* 2: value */
            if (++values > 1 || delimited(&r, &val, &val_len) < 0)
                return -1;
        } else if (tag == 0x18) { /* 3: key_strindex */
            if (varint(&r, &v) < 0)
                return -1;
        } else {
            return -1;
        }
    }
    const entry *e = lookup((const char *)key, key_len);
    if (e == NULL) /* not ours: validated, then skipped */
        return val == NULL ? 0 : validate(val, val_len, M_ANYVALUE, depth + 1);
    if (val == NULL)
        return -1; /* a known key without a value: the reference rejects the span */
    /* the AnyValue: exactly one field, of the expected kind */
    rd a = {val, val + val_len};
    uint64_t tag, u;
    if (a.p >= a.end || wire_tag(&a, &tag) < 0)
        return -1; /* empty: the reference says "expected ..., got None" */
    PyObject *out = NULL;
    const unsigned char *s;
    Py_ssize_t len, chars;
    switch (e->type) {
    case T_STR:
    case T_HEX:
        if (tag != 0x0A || delimited(&a, &s, &len) < 0 || a.p != a.end)
            return -1;
        if (!utf8_ok(s, len, &chars))
            return -1;
        if (e->type == T_HEX) {
            if (len == 0 || len > 64)
                return -1;
            for (Py_ssize_t i = 0; i < len; i++) {
                unsigned char c = s[i];
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
                    return -1;
            }
        } else if (chars > max_id_chars) {
            return -1;
        }
        out = string_of(s, len, e->slot);
        if (out == NULL)
            return -2;
        o->str[e->slot] = s;
        o->strlen_[e->slot] = len;
        break;
    case T_INT:
        if (tag != 0x18 || varint(&a, &u) < 0 || a.p != a.end)
            return -1;
        if ((long long)u < 0 || (long long)u > max_counter)
            return -1;
        out = PyLong_FromLongLong((long long)u);
        if (out == NULL)
            return -2;
        break;
    case T_FLOAT: {
        double d;
        if (tag != 0x21 || a.end - a.p != 8)
            return -1;
        memcpy(&d, a.p, 8);
        if (!(d == 0.0 || (d > 0.0 && d <= max_cost)))
            return -1; /* negative, NaN, too large: the reference says why */
        out = PyFloat_FromDouble(d);
        if (out == NULL)
            return -2;
        break;
    }
    case T_BOOL:
        if (tag != 0x10 || varint(&a, &u) < 0 || a.p != a.end)
            return -1;
        out = u ? Py_True : Py_False;
        Py_INCREF(out);
        break;
    default:
        return -1;
    }
    obs_set(o, e->slot, out);
    if (e->type != T_STR && e->type != T_HEX) {
        o->str[e->slot] = NULL; /* only string slots keep their bytes (classify reads them) */
        o->strlen_[e->slot] = 0;
    }
    o->known = 1;
    return 0;
}

static inline int bytes_eq(const unsigned char *s, Py_ssize_t n, const char *lit) {
    size_t m = strlen(lit);
    return (size_t)n == m && memcmp(s, lit, m) == 0;
}

static inline int starts_with(const unsigned char *s, Py_ssize_t n, const char *lit) {
    size_t m = strlen(lit);
    return (size_t)n >= m && memcmp(s, lit, m) == 0;
}

static int in_ops(const obs *o, char **ops, Py_ssize_t *lens, int count) {
    if (o->slot[S_OP] == NULL || o->str[S_OP] == NULL)
        return 0;
    const unsigned char *s = o->str[S_OP];
    Py_ssize_t n = o->strlen_[S_OP];
    for (int i = 0; i < count; i++)
        if (lens[i] == n && memcmp(ops[i], s, (size_t)n) == 0)
            return 1;
    return 0;
}

static inline int truthy_str(const obs *o, int slot) {
    return o->slot[slot] != NULL && o->str[slot] != NULL && o->strlen_[slot] > 0;
}

static PyObject *new_bytes(const unsigned char *s, Py_ssize_t n) {
    return PyBytes_FromStringAndSize((const char *)s, n);
}

/* The reference's _observe: the span's kind, or 0 when it means nothing for a run; -1 falls
 * back (a span the reference rejects). */
static int classify(obs *o, const unsigned char *name, Py_ssize_t name_len, int status_error) {
    int run = truthy_str(o, S_RUN_ID);
    int has_op = o->slot[S_OP] != NULL && o->str[S_OP] != NULL;
    const unsigned char *op = o->str[S_OP];
    Py_ssize_t op_len = o->strlen_[S_OP];
    int usage = o->slot[S_IN] != NULL || o->slot[S_OUT] != NULL;
    int kind;
    if (run) {
        if (bytes_eq(name, name_len, step_span)) {
            kind = K_STEP;
        } else if ((has_op && bytes_eq(op, op_len, invoke_agent)) ||
                   starts_with(name, name_len, invoke_agent)) {
            kind = K_RUN;
        } else if ((has_op && bytes_eq(op, op_len, execute_tool)) ||
                   starts_with(name, name_len, execute_tool)) {
            kind = K_TOOL;
            if (o->slot[S_TOOL_NAME] == NULL && starts_with(name, name_len, tool_head)) {
                Py_ssize_t head = (Py_ssize_t)strlen(tool_head);
                PyObject *t =
                    PyUnicode_DecodeUTF8((const char *)name + head, name_len - head, "strict");
                if (t == NULL)
                    return -2;
                obs_set(o, S_TOOL_NAME, t);
            }
            if (status_error && !truthy_str(o, S_ERROR)) {
                Py_INCREF(str_error);
                obs_set(o, S_ERROR, str_error);
                o->str[S_ERROR] = (const unsigned char *)"error";
                o->strlen_[S_ERROR] = 5;
            }
        } else if (usage || in_ops(o, model_ops, model_ops_len, n_model_ops)) {
            kind = K_MODEL;
        } else {
            return 0;
        }
        Py_INCREF(Py_False);
        obs_set(o, S_FOREIGN, Py_False);
    } else if (usage && !in_ops(o, aggregate_ops, aggregate_ops_len, n_aggregate_ops)) {
        kind = K_MODEL;
        Py_INCREF(Py_True);
        obs_set(o, S_FOREIGN, Py_True);
    } else {
        return 0;
    }
    if (kind == K_MODEL) {
        if (o->slot[S_MODEL] == NULL) {
            PyObject *m = truthy_str(o, S_RESP_MODEL) ? o->slot[S_RESP_MODEL] : str_empty;
            Py_INCREF(m);
            obs_set(o, S_MODEL, m);
        }
        int slots[4] = {S_IN, S_OUT, S_CACHED, S_REASONING};
        for (int i = 0; i < 4; i++) {
            PyObject *v = o->slot[slots[i]];
            if (v != NULL && !PyLong_CheckExact(v))
                return -1; /* (a key table that gives a count slot another type) */
            /* "x or 0": None and 0 become 0 */
            if (v == NULL || PyLong_AsLongLong(v) == 0) {
                Py_INCREF(int_zero);
                obs_set(o, slots[i], int_zero);
            }
        }
        if (run && PyLong_AsLongLong(o->slot[S_CACHED]) > PyLong_AsLongLong(o->slot[S_IN]))
            return -1; /* cached > input: the reference rejects the span and says so */
    }
    return kind;
}

/* Decode one Span message; appends its observation (if any) to `out`.
 * 0: done; -1: fall back; -2: Python error set. */
static int span(const unsigned char *p, Py_ssize_t n, PyObject *out, int depth) {
    rd r = {p, p + n};
    obs o;
    memset(&o, 0, sizeof(o));
    const unsigned char *name = (const unsigned char *)"", *trace = (const unsigned char *)"";
    const unsigned char *span_id = (const unsigned char *)"", *parent = (const unsigned char *)"";
    Py_ssize_t name_len = 0, trace_len = 0, span_len = 0, parent_len = 0;
    int status = 0, status_code = 0, rc = 0;
    while (r.p < r.end) {
        uint64_t tag, v;
        const unsigned char *s;
        Py_ssize_t len;
        if (wire_tag(&r, &tag) < 0)
            goto fallback;
        switch (tag) {
        case 0x0A: /* 1 trace_id */
            if (delimited(&r, &trace, &trace_len) < 0)
                goto fallback;
            break;
        case 0x12: /* 2 span_id */
            if (delimited(&r, &span_id, &span_len) < 0)
                goto fallback;
            break;
        case 0x1A: /* 3 trace_state */
            if (utf8_field(&r, &s, &len) < 0)
                goto fallback;
            break;
        case 0x22: /* 4 parent_span_id */
            if (delimited(&r, &parent, &parent_len) < 0)
                goto fallback;
            break;
        case 0x2A: /* 5 name */
            if (utf8_field(&r, &name, &name_len) < 0)
                goto fallback;
            break;
        case 0x30: /* 6 kind */
        case 0x50: /* 10 dropped_attributes_count */
        case 0x60: /* 12 dropped_events_count */
        case 0x70: /* 14 dropped_links_count */
            if (varint(&r, &v) < 0)
                goto fallback;
            break;
        case 0x39: /* 7 start_time_unix_nano */
        case 0x41: /* 8 end_time_unix_nano */
            if (skip_fixed(&r, 8) < 0)
                goto fallback;
            break;
        case 0x85: /* 16 flags: fixed32 */
            if (skip_fixed(&r, 4) < 0)
                goto fallback;
            break;
        case 0x4A: /* 9 attributes */
            if (delimited(&r, &s, &len) < 0)
                goto fallback;
            rc = attribute(s, len, &o, depth + 1);
            if (rc < 0)
                goto done;
            break;
        case 0x5A: /* 11 events */
            if (message_field(&r, M_EVENT, depth + 1) < 0)
                goto fallback;
            break;
        case 0x6A: /* 13 links */
            if (message_field(&r, M_LINK, depth + 1) < 0)
                goto fallback;
            break;
        case 0x7A: { /* 15 status: the last code on the wire counts, as in a parse */
            if (delimited(&r, &s, &len) < 0)
                goto fallback;
            status = 1;
            rd st = {s, s + len};
            while (st.p < st.end) {
                uint64_t t2;
                const unsigned char *m;
                Py_ssize_t ml;
                if (wire_tag(&st, &t2) < 0)
                    goto fallback;
                if (t2 == 0x12) {
                    if (utf8_field(&st, &m, &ml) < 0)
                        goto fallback;
                } else if (t2 == 0x18) {
                    if (varint(&st, &v) < 0)
                        goto fallback;
                    status_code = (int32_t)(uint32_t)v;
                } else {
                    goto fallback;
                }
            }
            break;
        }
        default:
            goto fallback;
        }
    }
    if (!o.known) {
        rc = 0;
        goto done;
    }
    rc = classify(&o, name, name_len, status && status_code == 2);
    if (rc <= 0)
        goto done;
    {
        int kind = rc;
        PyObject *v;
        Py_INCREF(kind_obj[kind]);
        obs_set(&o, S_KIND, kind_obj[kind]);
        /* consecutive spans mostly share their trace: reuse the last trace id object */
        if (last_trace != NULL && PyBytes_GET_SIZE(last_trace) == trace_len &&
            memcmp(PyBytes_AS_STRING(last_trace), trace, (size_t)trace_len) == 0) {
            v = last_trace;
            Py_INCREF(v);
        } else {
            if ((v = new_bytes(trace, trace_len)) == NULL)
                goto error;
            Py_INCREF(v);
            Py_XSETREF(last_trace, v);
        }
        obs_set(&o, S_TRACE_ID, v);
        if (kind == K_MODEL) {
            if ((v = new_bytes(span_id, span_len)) == NULL)
                goto error;
            obs_set(&o, S_SPAN_ID, v);
            if ((v = new_bytes(parent, parent_len)) == NULL)
                goto error;
            obs_set(&o, S_PARENT_SPAN_ID, v);
        }
        /* an Observation (a list subclass) holding the slots: allocated empty, given
         * nslots Nones at once (from configure()'s tuple of them), then the set slots put in
         * (PyList_SetItem steals them). Public API only: the list's own storage, which
         * differs by version and under free threading, stays the list's business. */
        PyObject *item = ((PyTypeObject *)obs_type)->tp_alloc((PyTypeObject *)obs_type, 0);
        int bad = item == NULL || PyList_SetSlice(item, 0, 0, nones) < 0;
        for (int i = 0; i < nslots && !bad; i++) {
            PyObject *x = o.slot[i];
            if (x == NULL)
                continue;
            o.slot[i] = NULL; /* the reference moves into the list */
            bad = PyList_SetItem(item, i, x) < 0;
        }
        bad = bad || PyList_Append(out, item) < 0;
        Py_XDECREF(item);
        if (bad)
            goto error;
    }
    rc = 0;
    goto done;
error:
    rc = -2;
    goto done;
fallback:
    rc = -1;
done:
    obs_clear(&o);
    return rc;
}

#endif /* OTLP_SPAN_H */
