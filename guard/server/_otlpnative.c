/* Native decode of an OTLP ExportTraceServiceRequest into the guard's observations.
 *
 * One pass over the wire bytes, no protobuf objects: the request is validated as the
 * generated classes would validate it (structure, strict UTF-8 of every string field) and the
 * span attributes the guard reads are turned into Observation lists, exactly as the reference
 * decoder (guard/server/_decode.py: decode_spans over the generated classes) turns them.
 *
 * Exactness by refusal: this path only answers for the canonical, well-formed case. Anything
 * else (an unknown field, a field with an unexpected wire type, a oneof or a value given
 * twice, a counter out of range, a value of another type than expected for a known key, a span
 * the reference would reject, nesting deeper than MAX_DEPTH, invalid UTF-8, a truncated
 * message) makes decode() return None, and the caller decodes the whole request with the
 * reference, which then says what is wrong with the reference's own words. So a request is
 * never accepted here that the reference refuses, and what is accepted decodes to the same
 * observations (tests/server/test_native_decode.py holds the two equal with hypothesis).
 *
 * Resumable: decode(data, state, max_spans) decodes at most max_spans spans and returns the
 * state to continue from, so the caller can yield to its event loop between slices of a
 * large request. The state is (position, level, end of the current ResourceSpans, end of the
 * current ScopeSpans): the only nesting above a span.
 *
 * Configured once by configure(): the key table (key bytes -> (slot, type)), the slots, the
 * Observation class and the operation sets, all from guard/server/_schema.py, so the names and
 * numbers live in one place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_SLOTS 48
#define TABLE_SIZE 512 /* open addressing, power of two, > 4x the keys */

enum { T_STR = 0, T_INT = 1, T_FLOAT = 2, T_BOOL = 3, T_HEX = 4 };

/* ---- configuration ------------------------------------------------------------------- */
typedef struct {
    const char *key; /* owned copy; NULL = empty entry */
    Py_ssize_t len;
    int slot;
    int type;
} entry;

static entry table[TABLE_SIZE];
static PyObject *obs_type = NULL;  /* the Observation class (a list subclass) */
static PyObject *kind_obj[5];      /* the KIND_* ints, by kind */
static PyObject *str_error = NULL; /* "error" */
static PyObject *str_empty = NULL; /* "" */
static PyObject *int_zero = NULL;
static PyObject *last_trace = NULL; /* the last trace id returned (see span()) */
/* the span and operation names classify() reads (guard.semconv): the step span's name, the
 * run's and the tool's operation (also the head of their span names) */
#define MAX_NAME 64
static char step_span[MAX_NAME], invoke_agent[MAX_NAME], execute_tool[MAX_NAME],
    tool_head[MAX_NAME + 1];
static int nslots = 0;
static int S_RUN_ID, S_OP, S_MODEL, S_RESP_MODEL, S_IN, S_OUT, S_CACHED, S_REASONING,
    S_TOOL_NAME, S_ERROR, S_KIND, S_FOREIGN, S_TRACE_ID, S_SPAN_ID, S_PARENT_SPAN_ID;
static int K_RUN, K_STEP, K_MODEL, K_TOOL;
static long long max_counter = 0;
static Py_ssize_t max_id_chars = 0;
static double max_cost = 0.0;
/* operation names as bytes: model calls, and aggregates (never a call when foreign) */
#define MAX_OPS 32
static char *model_ops[MAX_OPS];
static Py_ssize_t model_ops_len[MAX_OPS];
static int n_model_ops = 0;
static char *aggregate_ops[MAX_OPS];
static Py_ssize_t aggregate_ops_len[MAX_OPS];
static int n_aggregate_ops = 0;

static uint32_t hash_bytes(const char *p, Py_ssize_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 16777619u;
    }
    return h;
}

static const entry *lookup(const char *p, Py_ssize_t n) {
    uint32_t i = hash_bytes(p, n) & (TABLE_SIZE - 1);
    for (;;) {
        const entry *e = &table[i];
        if (e->key == NULL)
            return NULL;
        if (e->len == n && memcmp(e->key, p, (size_t)n) == 0)
            return e;
        i = (i + 1) & (TABLE_SIZE - 1);
    }
}

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
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 16777619u;
    }
    cached_str *c = &cache[h & (CACHE_SIZE - 1)];
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

/* ---- wire primitives --------------------------------------------------------------- */
typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} rd;

/* 0 on success; -1 when malformed or not canonical enough for this path */
static inline int varint(rd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end)
            return -1;
        unsigned char b = *r->p++;
        if (shift == 63 && b > 1)
            return -1;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A length-delimited field: [*start, *start + *len) inside the reader. */
static inline int delimited(rd *r, const unsigned char **start, Py_ssize_t *len) {
    uint64_t n;
    if (varint(r, &n) < 0 || n > (uint64_t)(r->end - r->p))
        return -1;
    *start = r->p;
    *len = (Py_ssize_t)n;
    r->p += n;
    return 0;
}

static inline int skip_fixed(rd *r, Py_ssize_t n) {
    if (r->end - r->p < n)
        return -1;
    r->p += n;
    return 0;
}

/* Strict UTF-8 (what upb and Python's codec accept: no overlongs, no surrogates, <= U+10FFFF).
 * Counts code points into *chars when chars is not NULL. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n, Py_ssize_t *chars) {
    Py_ssize_t i = 0, count = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            /* ASCII run: 8 bytes at a time */
            while (i + 8 <= n) {
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ull)
                    break;
                i += 8;
                count += 8;
            }
            if (i < n && s[i] < 0x80) {
                i++;
                count++;
            }
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0)
                return 0; /* overlong */
            if (c == 0xED && s[i + 1] > 0x9F)
                return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90)
                return 0; /* overlong */
            if (c == 0xF4 && s[i + 1] > 0x8F)
                return 0; /* > U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
        count++;
    }
    if (chars)
        *chars = count;
    return 1;
}

/* ---- validation of the messages this path does not read ----------------------------- */
enum { M_ANYVALUE, M_KEYVALUE, M_ARRAY, M_KVLIST, M_SCOPE, M_RESOURCE, M_ENTITYREF, M_EVENT, M_LINK };
enum { F_NONE = 0, F_VARINT, F_FIXED32, F_FIXED64, F_STR, F_BYTES, F_MSG };
typedef struct {
    unsigned char kind;
    unsigned char msg; /* for F_MSG */
} field;
#define NFIELDS 9
/* message -> field number (1..8) -> what it is; F_NONE = unknown (falls back) */
static const field schema[][NFIELDS] = {
    /* AnyValue: string, bool, int, double, array, kvlist, bytes, string_value_strindex */
    [M_ANYVALUE] = {{0}, {F_STR}, {F_VARINT}, {F_VARINT}, {F_FIXED64}, {F_MSG, M_ARRAY},
                    {F_MSG, M_KVLIST}, {F_BYTES}, {F_VARINT}},
    /* KeyValue: key, value, key_strindex */
    [M_KEYVALUE] = {{0}, {F_STR}, {F_MSG, M_ANYVALUE}, {F_VARINT}},
    /* ArrayValue: values; KeyValueList: values */
    [M_ARRAY] = {{0}, {F_MSG, M_ANYVALUE}},
    [M_KVLIST] = {{0}, {F_MSG, M_KEYVALUE}},
    /* InstrumentationScope: name, version, attributes, dropped_attributes_count */
    [M_SCOPE] = {{0}, {F_STR}, {F_STR}, {F_MSG, M_KEYVALUE}, {F_VARINT}},
    /* Resource: attributes, dropped_attributes_count, entity_refs */
    [M_RESOURCE] = {{0}, {F_MSG, M_KEYVALUE}, {F_VARINT}, {F_MSG, M_ENTITYREF}},
    /* EntityRef: schema_url, type, id_keys, description_keys */
    [M_ENTITYREF] = {{0}, {F_STR}, {F_STR}, {F_STR}, {F_STR}},
    /* Span.Event: time_unix_nano, name, attributes, dropped_attributes_count */
    [M_EVENT] = {{0}, {F_FIXED64}, {F_STR}, {F_MSG, M_KEYVALUE}, {F_VARINT}},
    /* Span.Link: trace_id, span_id, trace_state, attributes, dropped_attributes_count, flags */
    [M_LINK] = {{0}, {F_BYTES}, {F_BYTES}, {F_STR}, {F_MSG, M_KEYVALUE}, {F_VARINT}, {F_FIXED32}},
};

static int validate(const unsigned char *p, Py_ssize_t n, int msg, int depth);

/* One field of a message being validated; the tag is already read. */
static int validate_field(rd *r, int msg, uint64_t tag, int depth) {
    uint64_t number = tag >> 3;
    int wt = (int)(tag & 7);
    uint64_t v;
    const unsigned char *s;
    Py_ssize_t len;
    if (number == 0 || number >= NFIELDS)
        return -1;
    field f = schema[msg][number];
    switch (f.kind) {
    case F_VARINT:
        return wt == 0 ? varint(r, &v) : -1;
    case F_FIXED32:
        return wt == 5 ? skip_fixed(r, 4) : -1;
    case F_FIXED64:
        return wt == 1 ? skip_fixed(r, 8) : -1;
    case F_STR:
        if (wt != 2 || delimited(r, &s, &len) < 0)
            return -1;
        return utf8_ok(s, len, NULL) ? 0 : -1;
    case F_BYTES:
        return wt == 2 ? delimited(r, &s, &len) : -1;
    case F_MSG:
        if (wt != 2 || delimited(r, &s, &len) < 0)
            return -1;
        return validate(s, len, f.msg, depth + 1);
    default:
        return -1;
    }
}

static int validate(const unsigned char *p, Py_ssize_t n, int msg, int depth) {
    if (depth > MAX_DEPTH)
        return -1;
    rd r = {p, p + n};
    int values = 0;
    while (r.p < r.end) {
        uint64_t tag;
        if (varint(&r, &tag) < 0)
            return -1;
        /* a oneof set twice (AnyValue) or a KeyValue's value twice: the parse merges them;
         * leave those to the reference */
        if ((msg == M_ANYVALUE || (msg == M_KEYVALUE && (tag >> 3) == 2)) && ++values > 1)
            return -1;
        if (validate_field(&r, msg, tag, depth) < 0)
            return -1;
    }
    return 0;
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
        if (varint(&r, &tag) < 0)
            return -1;
        if (tag == 0x0A) { /* 1: key (the last one counts) */
            if (delimited(&r, &key, &key_len) < 0 || !utf8_ok(key, key_len, NULL))
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
    if (a.p >= a.end || varint(&a, &tag) < 0)
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
    if (e->type != T_STR && e->type != T_HEX)
        o->str[e->slot] = NULL; /* only string slots keep their bytes (classify reads them) */
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
    if (o->slot[S_OP] == NULL)
        return 0;
    const unsigned char *s = o->str[S_OP];
    Py_ssize_t n = o->strlen_[S_OP];
    for (int i = 0; i < count; i++)
        if (lens[i] == n && memcmp(ops[i], s, (size_t)n) == 0)
            return 1;
    return 0;
}

static inline int truthy_str(const obs *o, int slot) {
    return o->slot[slot] != NULL && o->strlen_[slot] > 0;
}

static PyObject *new_bytes(const unsigned char *s, Py_ssize_t n) {
    return PyBytes_FromStringAndSize((const char *)s, n);
}

/* The reference's _observe: the span's kind, or 0 when it means nothing for a run; -1 falls
 * back (a span the reference rejects). */
static int classify(obs *o, const unsigned char *name, Py_ssize_t name_len, int status_error) {
    int run = truthy_str(o, S_RUN_ID);
    int has_op = o->slot[S_OP] != NULL;
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
        if (varint(&r, &tag) < 0)
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
            if (delimited(&r, &s, &len) < 0 || !utf8_ok(s, len, NULL))
                goto fallback;
            break;
        case 0x22: /* 4 parent_span_id */
            if (delimited(&r, &parent, &parent_len) < 0)
                goto fallback;
            break;
        case 0x2A: /* 5 name */
            if (delimited(&r, &name, &name_len) < 0 || !utf8_ok(name, name_len, NULL))
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
            if (delimited(&r, &s, &len) < 0 || validate(s, len, M_EVENT, depth + 1) < 0)
                goto fallback;
            break;
        case 0x6A: /* 13 links */
            if (delimited(&r, &s, &len) < 0 || validate(s, len, M_LINK, depth + 1) < 0)
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
                if (varint(&st, &t2) < 0)
                    goto fallback;
                if (t2 == 0x12) {
                    if (delimited(&st, &m, &ml) < 0 || !utf8_ok(m, ml, NULL))
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
        /* an Observation (a list subclass) holding the slots: allocated empty, then given
         * its item array directly (what list.__init__ would copy in) */
        PyObject *item = ((PyTypeObject *)obs_type)->tp_alloc((PyTypeObject *)obs_type, 0);
        if (item == NULL)
            goto error;
        PyObject **items = PyMem_New(PyObject *, nslots);
        if (items == NULL) {
            Py_DECREF(item);
            PyErr_NoMemory();
            goto error;
        }
        for (int i = 0; i < nslots; i++) {
            PyObject *x = o.slot[i];
            if (x == NULL) {
                x = Py_None;
                Py_INCREF(x);
            }
            items[i] = x;
            o.slot[i] = NULL; /* the reference moves into the list */
        }
        ((PyListObject *)item)->ob_item = items;
        ((PyListObject *)item)->allocated = nslots;
        Py_SET_SIZE(item, nslots);
        int bad = PyList_Append(out, item);
        Py_DECREF(item);
        if (bad < 0)
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

/* ---- the request: ExportTraceServiceRequest > ResourceSpans > ScopeSpans > Span ----------- */
enum { L_REQUEST = 0, L_RESOURCE = 1, L_SCOPE = 2 };

static PyObject *sp_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode(data, state, max_spans)");
        return NULL;
    }
    if (obs_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t max_spans = PyLong_AsSsize_t(args[2]);
    if (max_spans == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *base = buf.buf;
    Py_ssize_t size = buf.len, pos = 0, rs_end = 0, ss_end = 0;
    int level = L_REQUEST;
    if (args[1] != Py_None) {
        if (!PyArg_ParseTuple(args[1], "ninn", &pos, &level, &rs_end, &ss_end)) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        if (pos < 0 || pos > size || rs_end > size || ss_end > size || level < 0 || level > 2) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_ValueError, "bad state");
            return NULL;
        }
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t spans = 0;
    rd r = {base + pos, base + size};
    int rc = 0;
    while (spans < max_spans) {
        const unsigned char *s;
        Py_ssize_t len;
        uint64_t tag;
        if (level == L_SCOPE) {
            rd in = {r.p, base + ss_end};
            if (in.p >= in.end) {
                level = L_RESOURCE;
                continue;
            }
            if (varint(&in, &tag) < 0)
                goto fallback;
            if (tag == 0x12) { /* 2 spans */
                if (delimited(&in, &s, &len) < 0)
                    goto fallback;
                rc = span(s, len, out, 3);
                if (rc < 0)
                    goto failed;
                spans++;
            } else if (tag == 0x0A) { /* 1 scope */
                if (delimited(&in, &s, &len) < 0 || validate(s, len, M_SCOPE, 3) < 0)
                    goto fallback;
            } else if (tag == 0x1A) { /* 3 schema_url */
                if (delimited(&in, &s, &len) < 0 || !utf8_ok(s, len, NULL))
                    goto fallback;
            } else {
                goto fallback;
            }
            r.p = in.p;
        } else if (level == L_RESOURCE) {
            rd in = {r.p, base + rs_end};
            if (in.p >= in.end) {
                level = L_REQUEST;
                continue;
            }
            if (varint(&in, &tag) < 0)
                goto fallback;
            if (tag == 0x12) { /* 2 scope_spans: descend */
                if (delimited(&in, &s, &len) < 0)
                    goto fallback;
                ss_end = (s - base) + len;
                in.p = s;
                level = L_SCOPE;
            } else if (tag == 0x0A) { /* 1 resource */
                if (delimited(&in, &s, &len) < 0 || validate(s, len, M_RESOURCE, 2) < 0)
                    goto fallback;
            } else if (tag == 0x1A) { /* 3 schema_url */
                if (delimited(&in, &s, &len) < 0 || !utf8_ok(s, len, NULL))
                    goto fallback;
            } else {
                goto fallback;
            }
            r.p = in.p;
        } else {
            if (r.p >= r.end)
                break;
            if (varint(&r, &tag) < 0 || tag != 0x0A) /* 1 resource_spans: descend */
                goto fallback;
            if (delimited(&r, &s, &len) < 0)
                goto fallback;
            rs_end = (s - base) + len;
            r.p = s;
            level = L_RESOURCE;
        }
    }
    pos = r.p - base;
    PyBuffer_Release(&buf);
    int finished = level == L_REQUEST && pos >= size;
    PyObject *state;
    if (finished) {
        state = Py_None;
        Py_INCREF(state);
    } else {
        state = Py_BuildValue("(ninn)", pos, level, rs_end, ss_end);
        if (state == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    PyObject *result = Py_BuildValue("(NnN)", out, spans, state);
    return result;
failed:
    if (rc == -2) {
        PyBuffer_Release(&buf);
        Py_DECREF(out);
        return NULL;
    }
fallback:
    PyBuffer_Release(&buf);
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* ---- configure ------------------------------------------------------------------------- */
static int copy_ops(PyObject *seq, char **ops, Py_ssize_t *lens, int *count) {
    PyObject *fast = PySequence_Fast(seq, "operations must be a sequence of str");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > MAX_OPS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many operations");
        return -1;
    }
    for (int i = 0; i < *count; i++)
        PyMem_Free(ops[i]);
    *count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(fast, i), &len);
        if (s == NULL) {
            Py_DECREF(fast);
            return -1;
        }
        ops[i] = PyMem_Malloc((size_t)len + 1);
        if (ops[i] == NULL) {
            Py_DECREF(fast);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(ops[i], s, (size_t)len + 1);
        lens[i] = len;
        *count = (int)i + 1;
    }
    Py_DECREF(fast);
    return 0;
}

static int get_int(PyObject *d, const char *name, int *out) {
    PyObject *v = PyDict_GetItemString(d, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: missing %s", name);
        return -1;
    }
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int)x;
    return 0;
}

static int copy_name(PyObject *v, char *dst) {
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(v, &len);
    if (s == NULL)
        return -1;
    if (len == 0 || len >= MAX_NAME) {
        PyErr_SetString(PyExc_ValueError, "configure: a name must have 1..63 bytes");
        return -1;
    }
    memcpy(dst, s, (size_t)len + 1);
    return 0;
}

/* configure(keys, slots, observation, model_ops, aggregate_ops, bounds, unique, names)
 *   keys: {str: (slot, type)}; slots: {name: index} incl. "NSLOTS" and the KIND_* values;
 *   bounds: (max_counter, max_id_chars, max_cost); unique: slots of per-call strings;
 *   names: (step span name, run operation, tool operation) */
static PyObject *sp_configure(PyObject *self, PyObject *args) {
    PyObject *keys, *slots, *cls, *mops, *aops, *unique, *n_step, *n_run, *n_tool;
    long long mc;
    Py_ssize_t mid;
    double mcost;
    if (!PyArg_ParseTuple(args, "O!O!OOO(Lnd)O(OOO)", &PyDict_Type, &keys, &PyDict_Type, &slots,
                          &cls, &mops, &aops, &mc, &mid, &mcost, &unique, &n_step, &n_run,
                          &n_tool))
        return NULL;
    if (copy_name(n_step, step_span) < 0 || copy_name(n_run, invoke_agent) < 0 ||
        copy_name(n_tool, execute_tool) < 0)
        return NULL;
    snprintf(tool_head, sizeof(tool_head), "%s ", execute_tool);
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the observation class must subclass list");
        return NULL;
    }
    struct {
        const char *name;
        int *dst;
    } names[] = {{"RUN_ID", &S_RUN_ID},       {"OP", &S_OP},
                 {"MODEL", &S_MODEL},         {"RESP_MODEL", &S_RESP_MODEL},
                 {"IN", &S_IN},               {"OUT", &S_OUT},
                 {"CACHED", &S_CACHED},       {"REASONING", &S_REASONING},
                 {"TOOL_NAME", &S_TOOL_NAME}, {"ERROR", &S_ERROR},
                 {"KIND", &S_KIND},           {"FOREIGN", &S_FOREIGN},
                 {"TRACE_ID", &S_TRACE_ID},   {"SPAN_ID", &S_SPAN_ID},
                 {"PARENT_SPAN_ID", &S_PARENT_SPAN_ID}, {"NSLOTS", &nslots},
                 {"KIND_RUN", &K_RUN},        {"KIND_STEP", &K_STEP},
                 {"KIND_MODEL", &K_MODEL},    {"KIND_TOOL", &K_TOOL}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (get_int(slots, names[i].name, names[i].dst) < 0)
            return NULL;
    if (nslots <= 0 || nslots > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "configure: NSLOTS out of range");
        return NULL;
    }
    int kinds[4] = {K_RUN, K_STEP, K_MODEL, K_TOOL};
    for (int i = 0; i < 4; i++)
        if (kinds[i] < 1 || kinds[i] > 4) {
            PyErr_SetString(PyExc_ValueError, "configure: KIND_* must be 1..4");
            return NULL;
        }
    for (int i = 0; i < TABLE_SIZE; i++) {
        PyMem_Free((void *)table[i].key);
        table[i].key = NULL;
    }
    PyObject *k, *v;
    Py_ssize_t it = 0, count = 0;
    while (PyDict_Next(keys, &it, &k, &v)) {
        Py_ssize_t len;
        int slot, type;
        const char *s = PyUnicode_AsUTF8AndSize(k, &len);
        if (s == NULL || !PyArg_ParseTuple(v, "ii", &slot, &type))
            return NULL;
        if (slot < 0 || slot >= nslots || type < 0 || type > 4 || ++count > TABLE_SIZE / 4) {
            PyErr_SetString(PyExc_ValueError, "configure: bad key table");
            return NULL;
        }
        char *copy = PyMem_Malloc((size_t)len + 1);
        if (copy == NULL)
            return PyErr_NoMemory();
        memcpy(copy, s, (size_t)len + 1);
        uint32_t i = hash_bytes(s, len) & (TABLE_SIZE - 1);
        while (table[i].key != NULL)
            i = (i + 1) & (TABLE_SIZE - 1);
        table[i] = (entry){copy, len, slot, type};
    }
    if (copy_ops(mops, model_ops, model_ops_len, &n_model_ops) < 0 ||
        copy_ops(aops, aggregate_ops, aggregate_ops_len, &n_aggregate_ops) < 0)
        return NULL;
    memset(unique_slot, 0, sizeof(unique_slot));
    PyObject *fast = PySequence_Fast(unique, "unique must be a sequence of slots");
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        long u = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (u < 0 || u >= nslots) {
            Py_DECREF(fast);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "configure: unique slot out of range");
            return NULL;
        }
        unique_slot[u] = 1;
    }
    Py_DECREF(fast);
    for (int i = 0; i < CACHE_SIZE; i++)
        Py_CLEAR(cache[i].value);
    for (int i = 1; i <= 4; i++) {
        Py_XSETREF(kind_obj[i], PyLong_FromLong(i));
        if (kind_obj[i] == NULL)
            return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(obs_type, cls);
    max_counter = mc;
    max_id_chars = mid;
    max_cost = mcost;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", sp_configure, METH_VARARGS,
     "configure(keys, slots, observation_class, model_ops, aggregate_ops, bounds, unique, names)"},
    {"decode", (PyCFunction)(void (*)(void))sp_decode, METH_FASTCALL,
     "decode(data, state, max_spans) -> (observations, spans, state) | None (fall back)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpnative",
                                    "Native OTLP span decode (see _nativedecode.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__otlpnative(void) {
    str_error = PyUnicode_InternFromString("error");
    str_empty = PyUnicode_InternFromString("");
    int_zero = PyLong_FromLong(0);
    if (str_error == NULL || str_empty == NULL || int_zero == NULL)
        return NULL;
    return PyModule_Create(&module);
}
