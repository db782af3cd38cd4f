/*
 * Optional native fast paths for guard/policy/_fingerprint.py.
 *
 * Every tool call is fingerprinted twice (HMAC-SHA256 of its canonical arguments and of its
 * result). In pure Python that is the largest part of the SDK's per-step overhead, so this
 * module does the common case natively: a dict of short printable-ASCII strings, ints, bools
 * and None, canonicalised exactly as _fingerprint.py does and hashed without building any
 * intermediate Python object. Anything outside that case returns None and the pure-Python
 * implementation (the reference) handles it; tests check both give the same bytes.
 *
 * SHA-256 is implemented here (FIPS 180-4) so the module needs nothing but a C compiler: the
 * keyed inner/outer states are computed once and copied per fingerprint, as in Python.
 * Pure computation: no I/O, no globals written after import, safe under free threading of
 * independent calls (states are immutable bytes; each call copies them to the stack).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* ---- SHA-256 --------------------------------------------------------------------------- */

typedef struct {
    uint32_t h[8];
    uint64_t len;     /* bytes absorbed */
    uint32_t buflen;  /* bytes pending in buf */
    uint8_t buf[64];
} sha_ctx;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(uint32_t *h, const uint8_t *p) {
    uint32_t w[64], a, b, c, d, e, f, g, hh, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
               ((uint32_t)p[4 * i + 2] << 8) | (uint32_t)p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (i = 0; i < 64; i++) {
        t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

static void sha_init(sha_ctx *c) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memset(c, 0, sizeof *c); /* padding too: a state's bytes are deterministic */
    memcpy(c->h, iv, sizeof iv);
}

static void sha_update(sha_ctx *c, const uint8_t *p, size_t n) {
    c->len += n;
    if (c->buflen) {
        size_t take = 64 - c->buflen < n ? 64 - c->buflen : n;
        memcpy(c->buf + c->buflen, p, take);
        c->buflen += (uint32_t)take, p += take, n -= take;
        if (c->buflen < 64) return;
        sha_block(c->h, c->buf);
        c->buflen = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha_block(c->h, p);
    if (n) memcpy(c->buf, p, n), c->buflen = (uint32_t)n;
}

static void sha_final(sha_ctx *c, uint8_t out[32]) {
    uint64_t bits = c->len * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (c->buflen < 56 ? 56 : 120) - c->buflen;
    int i;
    for (i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(c, pad, padlen + 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24), out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8), out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

/* A state travels through Python as an immutable bytes object holding one sha_ctx. */
static int get_ctx(PyObject *o, sha_ctx *c) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != (Py_ssize_t)sizeof(sha_ctx)) {
        PyErr_SetString(PyExc_TypeError, "not a state made by _speedups.state()");
        return -1;
    }
    memcpy(c, PyBytes_AS_STRING(o), sizeof(sha_ctx));
    return 0;
}

/* HMAC's outer half, truncated to 128 bits as lowercase hex (what the Python side returns). */
static PyObject *finish_hex(sha_ctx *inner, PyObject *outer_state) {
    static const char hexd[] = "0123456789abcdef";
    uint8_t d[32];
    sha_ctx o;
    PyObject *s;
    Py_UCS1 *w;
    int i;
    if (get_ctx(outer_state, &o) < 0) return NULL;
    sha_final(inner, d);
    sha_update(&o, d, 32);
    sha_final(&o, d);
    s = PyUnicode_New(32, 127);
    if (s == NULL) return NULL;
    w = PyUnicode_1BYTE_DATA(s);
    for (i = 0; i < 16; i++) w[2 * i] = hexd[d[i] >> 4], w[2 * i + 1] = hexd[d[i] & 15];
    return s;
}

/* ---- canonical form of the fast case ----------------------------------------------------- */

/* A growable output buffer (on the stack until it outgrows it). */
typedef struct {
    char *p;
    size_t n, cap;
    char stack[512];
} obuf;

static void ob_init(obuf *b) { b->p = b->stack, b->n = 0, b->cap = sizeof b->stack; }
static void ob_free(obuf *b) {
    if (b->p != b->stack) PyMem_Free(b->p);
}
static int ob_put(obuf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        char *p = PyMem_Malloc(cap);
        if (p == NULL) return -1;
        memcpy(p, b->p, b->n);
        ob_free(b);
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int is_lower_alpha(char c) { return c >= 'a' && c <= 'z'; }
static int is_lower_alnum(char c) { return is_lower_alpha(c) || (c >= '0' && c <= '9'); }

/* _norm() of printable ASCII without a double space: strip(" ") then casefold (ASCII: lower).
 * Writes into out (len(s) bytes at most); returns the length, or -1 when s is not that case. */
static Py_ssize_t norm_ascii(PyObject *s, char *out) {
    const char *p;
    Py_ssize_t n, i, a, z;
    if (!PyUnicode_IS_ASCII(s)) return -1;
    p = (const char *)PyUnicode_1BYTE_DATA(s);
    n = PyUnicode_GET_LENGTH(s);
    for (i = 0; i < n; i++) {
        if (p[i] < 0x20 || p[i] > 0x7e) return -1;
        if (p[i] == ' ' && i + 1 < n && p[i + 1] == ' ') return -1;
    }
    for (a = 0; a < n && p[a] == ' '; a++);
    for (z = n; z > a && p[z - 1] == ' '; z--);
    for (i = a; i < z; i++) out[i - a] = (p[i] >= 'A' && p[i] <= 'Z') ? p[i] + 32 : p[i];
    return z - a;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} span;

static int span_cmp(const span *x, const span *y) {
    Py_ssize_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, (size_t)m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* JSON string (json.encoder.encode_basestring: printable ASCII needs only " and \ escaped). */
static int put_json_str(obuf *b, const char *p, Py_ssize_t n) {
    Py_ssize_t i, run = 0;
    if (ob_put(b, "\"", 1) < 0) return -1;
    for (i = 0; i < n; i++) {
        if (p[i] == '"' || p[i] == '\\') {
            if (ob_put(b, p + run, (size_t)(i - run)) < 0 || ob_put(b, "\\", 1) < 0) return -1;
            run = i;
        }
    }
    if (ob_put(b, p + run, (size_t)(n - run)) < 0) return -1;
    return ob_put(b, "\"", 1);
}

#define SHORT_MAX_CHARS 64
#define SHORT_MAX_TOKENS 8

/* _string_cached()'s fast path, written as JSON: returns 1 when written, 0 when the string
 * is not the fast case (the caller falls back to Python), -1 on error. The fast case: printable
 * ASCII without a double space whose normalised form starts with a letter; short text made of
 * letter/digit words loses its word order (sorted), anything else is kept as normalised. */
static int put_string(obuf *b, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), t, i, spaces = 0;
    char small[256], *t_p = small;
    int rc;
    if (n > (Py_ssize_t)sizeof small) {
        t_p = PyMem_Malloc((size_t)n);
        if (t_p == NULL) return -1;
    }
    t = norm_ascii(s, t_p);
    if (t < 1 || !is_lower_alpha(t_p[0])) {
        rc = 0;
        goto done;
    }
    for (i = 0; i < t; i++) spaces += t_p[i] == ' ';
    if (spaces == 0 || t > SHORT_MAX_CHARS || spaces >= SHORT_MAX_TOKENS) {
        rc = put_json_str(b, t_p, t) < 0 ? -1 : 1;
        goto done;
    }
    /* Short text: only words of letters and digits here (punctuation takes the regex path).
     * No double space and stripped ends: split(" ") yields no empty token, and with two or
     * more tokens the joined result has a space, so it is never numeric. */
    {
        span tok[SHORT_MAX_TOKENS], key;
        Py_ssize_t k = 0, from = 0, j;
        for (i = 0; i < t; i++) {
            if (t_p[i] == ' ') {
                tok[k].p = t_p + from, tok[k].n = i - from, k++, from = i + 1;
            } else if (!is_lower_alnum(t_p[i])) {
                rc = 0;
                goto done;
            }
        }
        tok[k].p = t_p + from, tok[k].n = t - from, k++;
        for (i = 1; i < k; i++) { /* insertion sort: at most 8 tokens */
            key = tok[i];
            for (j = i - 1; j >= 0 && span_cmp(&tok[j], &key) > 0; j--) tok[j + 1] = tok[j];
            tok[j + 1] = key;
        }
        rc = 1;
        if (ob_put(b, "\"", 1) < 0) rc = -1;
        for (i = 0; i < k && rc == 1; i++) {
            if ((i && ob_put(b, " ", 1) < 0) || ob_put(b, tok[i].p, (size_t)tok[i].n) < 0)
                rc = -1;
        }
        if (rc == 1 && ob_put(b, "\"", 1) < 0) rc = -1;
    }
done:
    if (t_p != small) PyMem_Free(t_p);
    return rc;
}

/* One scalar value as canonical JSON: 1 written, 0 not the fast case, -1 error. */
static int put_scalar(obuf *b, PyObject *v) {
    if (PyUnicode_CheckExact(v)) return put_string(b, v);
    if (v == Py_None) return ob_put(b, "null", 4) < 0 ? -1 : 1;
    if (v == Py_True) return ob_put(b, "true", 4) < 0 ? -1 : 1;
    if (v == Py_False) return ob_put(b, "false", 5) < 0 ? -1 : 1;
    if (PyLong_CheckExact(v)) { /* integers stay exact: their decimal form */
        int overflow = 0;
        char num[32];
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return 0; /* big ints: the Python path (int repr limits apply) */
        if (x == -1 && PyErr_Occurred()) return -1;
        return ob_put(b, num, (size_t)snprintf(num, sizeof num, "%lld", x)) < 0 ? -1 : 1;
    }
    return 0;
}

/* The end of action() and result(): the HMAC of what was written (rc 1), None when the value
 * was not the fast case (rc 0), or the pending error (rc -1). Frees the buffer. */
static PyObject *finish_buffer(int rc, obuf *b, sha_ctx *inner, PyObject *outer_state) {
    PyObject *res = NULL;
    if (rc == 1) {
        sha_update(inner, (const uint8_t *)b->p, b->n);
        res = finish_hex(inner, outer_state);
    } else if (rc == 0) {
        res = Py_NewRef(Py_None);
    }
    ob_free(b);
    return res;
}

#define MAX_KEYS 32

typedef struct {
    span key;
    PyObject *value;
} entry;

/* action(inner, outer, args, ignore) -> str | None
 * inner: the tool's inner state ("action\0<tool>\0" fed); outer: the outer state; args: the
 * arguments; ignore: a tuple of normalised ASCII keys (bytes) to drop. None: not the fast case. */
static PyObject *sp_action(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *d, *ignore, *k, *v;
    Py_ssize_t pos = 0, n = 0, i, j;
    entry e[MAX_KEYS], tmp;
    char keybuf[MAX_KEYS][64];
    sha_ctx inner;
    obuf b;
    int rc;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "action() takes 4 arguments");
        return NULL;
    }
    d = args[2], ignore = args[3];
    if (!PyDict_CheckExact(d) || !PyTuple_Check(ignore) || PyDict_GET_SIZE(d) > MAX_KEYS)
        Py_RETURN_NONE;
    if (get_ctx(args[0], &inner) < 0) return NULL;
    while (PyDict_Next(d, &pos, &k, &v)) {
        Py_ssize_t kn;
        int skip = 0;
        if (!PyUnicode_CheckExact(k) || PyUnicode_GET_LENGTH(k) > 64) Py_RETURN_NONE;
        kn = norm_ascii(k, keybuf[n]);
        if (kn < 0) Py_RETURN_NONE;
        for (j = 0; j < PyTuple_GET_SIZE(ignore); j++) {
            PyObject *ig = PyTuple_GET_ITEM(ignore, j);
            if (!PyBytes_Check(ig)) Py_RETURN_NONE;
            if (PyBytes_GET_SIZE(ig) == kn && memcmp(PyBytes_AS_STRING(ig), keybuf[n], kn) == 0) {
                skip = 1;
                break;
            }
        }
        if (skip) continue;
        e[n].key.p = keybuf[n], e[n].key.n = kn, e[n].value = v;
        for (j = 0; j < n; j++) /* keys equal once normalised: Python picks one by value */
            if (span_cmp(&e[j].key, &e[n].key) == 0) Py_RETURN_NONE;
        n++;
    }
    for (i = 1; i < n; i++) { /* sort_keys: code point order, which is byte order in ASCII */
        tmp = e[i];
        for (j = i - 1; j >= 0 && span_cmp(&e[j].key, &tmp.key) > 0; j--) e[j + 1] = e[j];
        e[j + 1] = tmp;
    }
    ob_init(&b);
    rc = ob_put(&b, "{", 1) < 0 ? -1 : 1;
    for (i = 0; i < n && rc == 1; i++) {
        if ((i && ob_put(&b, ",", 1) < 0) || put_json_str(&b, e[i].key.p, e[i].key.n) < 0 ||
            ob_put(&b, ":", 1) < 0)
            rc = -1;
        else
            rc = put_scalar(&b, e[i].value);
    }
    if (rc == 1 && ob_put(&b, "}", 1) < 0) rc = -1;
    return finish_buffer(rc, &b, &inner, args[1]);
}

/* result(inner, outer, value) -> str | None: the result hash of an int, None, a bool or a
 * fast-case string (as Fingerprinter.result() writes them), else None. */
static PyObject *sp_result(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    sha_ctx inner;
    obuf b;
    int rc;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "result() takes 3 arguments");
        return NULL;
    }
    if (get_ctx(args[0], &inner) < 0) return NULL;
    ob_init(&b);
    rc = put_scalar(&b, args[2]);
    return finish_buffer(rc, &b, &inner, args[1]);
}

/* mac(inner, outer, payload: str) -> str: HMAC of the UTF-8 payload, 32 hex chars. */
static PyObject *sp_mac(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    sha_ctx inner;
    const char *p;
    Py_ssize_t n;
    if (nargs != 3 || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mac(inner, outer, payload: str)");
        return NULL;
    }
    if (get_ctx(args[0], &inner) < 0) return NULL;
    p = PyUnicode_AsUTF8AndSize(args[2], &n);
    if (p == NULL) return NULL;
    sha_update(&inner, (const uint8_t *)p, (size_t)n);
    return finish_hex(&inner, args[1]);
}

/* state(data: bytes, base: bytes | None = None) -> bytes: a state that has absorbed data. */
static PyObject *sp_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    sha_ctx c;
    Py_buffer view;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "state(data, base=None)");
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None) {
        if (get_ctx(args[1], &c) < 0) return NULL;
    } else {
        sha_init(&c);
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    sha_update(&c, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)&c, sizeof c);
}

/* ---- the loop detector's window ---------------------------------------------------------- */

/* The first 64 bits of a canonical fingerprint (16+ ASCII hex digits), 0 for anything else
 * (which the Python reference handles: short, foreign or malformed ids). */
static int hex64(PyObject *s, uint64_t *out) {
    const Py_UCS1 *p;
    uint64_t v = 0;
    int i;
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s) || PyUnicode_GET_LENGTH(s) < 16)
        return 0;
    p = PyUnicode_1BYTE_DATA(s);
    for (i = 0; i < 16; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v ? v : 1; /* 0 means "no value" in the rings */
    return 1;
}

static Py_ssize_t count64(const char *ring, Py_ssize_t n, uint64_t x) {
    Py_ssize_t i, c = 0;
    uint64_t v;
    for (i = 0; i < n; i++) {
        memcpy(&v, ring + 8 * i, 8);
        c += v == x;
    }
    return c;
}

/* How many calls in a row, newest (at `slot`) first, returned `r`: unwritten slots hold 0,
 * which no known result is, so the walk stops at the window's oldest call. */
static Py_ssize_t streak64(const char *ring, Py_ssize_t n, Py_ssize_t slot, uint64_t r) {
    Py_ssize_t c = 0, i = slot;
    uint64_t v;
    while (c < n) {
        memcpy(&v, ring + 8 * i, 8);
        if (v != r) break;
        c++;
        i = i ? i - 1 : n - 1;
    }
    return c;
}

/* After a call is written at `slot`: can no pattern fire? Repeats and cycles need this action
 * at least need_a times in the window (a cycle's current call recurs once per period);
 * same_result needs this (known) result in need_r calls in a row, the newest included. */
static int quiet_window(const char *acts, const char *res, Py_ssize_t n, Py_ssize_t slot,
                        uint64_t a, uint64_t r, Py_ssize_t need_a, Py_ssize_t need_r) {
    return count64(acts, n, a) < need_a && (!r || streak64(res, n, slot, r) < need_r);
}

/* observe(acts, res, slot, action, result, need_a, need_r) -> bool | None
 * LoopDetector.observe_action()'s first half: writes the call into slot `slot` of the two
 * rings (array('Q') of the same length) and returns True when no pattern can fire (the
 * action occurs fewer than need_a times and the result, when known, ends a run of fewer than
 * need_r equal results: see quiet_window),
 * False when the full check must run. None, with nothing written: not a canonical
 * fingerprint, for the reference to handle. */
static PyObject *sp_observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer va, vr;
    Py_ssize_t slot, need_a, need_r, n;
    uint64_t a, r = 0;
    PyObject *result, *res = NULL;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "observe() takes 7 arguments");
        return NULL;
    }
    result = args[4];
    if (!hex64(args[3], &a)) Py_RETURN_NONE;
    if (result != Py_None && !(PyUnicode_CheckExact(result) && PyUnicode_GET_LENGTH(result) == 0))
        if (!hex64(result, &r)) Py_RETURN_NONE;
    slot = PyLong_AsSsize_t(args[2]);
    need_a = PyLong_AsSsize_t(args[5]);
    need_r = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL; /* before anything is written */
    if (PyObject_GetBuffer(args[0], &va, PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &vr, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&va);
        return NULL;
    }
    n = va.len / 8;
    if (va.len != vr.len || va.len % 8 || slot < 0 || slot >= n) {
        PyErr_SetString(PyExc_ValueError, "observe(): rings of unequal size or slot out of range");
    } else {
        memcpy((char *)va.buf + 8 * slot, &a, 8);
        memcpy((char *)vr.buf + 8 * slot, &r, 8);
        res = PyBool_FromLong(quiet_window(va.buf, vr.buf, n, slot, a, r, need_a, need_r));
    }
    PyBuffer_Release(&vr);
    PyBuffer_Release(&va);
    return res;
}

/* ---- record kernels: the policy's per-span arithmetic on its own objects --------------------
 *
 * The guard's span path (guard/server/_spannative.c) records every span of the three common
 * kinds through these, instead of through Budget.record_step / record_model_call,
 * LoopDetector.observe_action / end_step and Forecaster.observe. Each one does exactly what its
 * Python method does, in the same order and with the same Python arithmetic (PyNumber_*), on
 * the slots of the policy's own classes, which guard/policy/_kernels.py hands to bind() (the
 * offsets are read from the classes' member descriptors, and every object is checked to be
 * of exactly the bound class). Exactness by refusal: a kernel that returns None has changed
 * nothing, and its caller takes the Python method instead (a budget whose lock is held by
 * another thread, a count or cost the Python check would refuse, a step it does not cover).
 * tests/policy/test_policy_kernels.py holds each kernel to its method. */

enum {
    B_USAGES, B_SEQ, B_LOCK, B_LIMITS, B_TRIG, B_USAGE, B_RESERVED, B_CLOCK, B_STARTED,
    B_PAUSED_AT, B_PAUSED_TOTAL, NB
};
enum { U_STEPS, U_MODEL_CALLS, U_IN, U_OUT, U_REASONING, U_CACHED, U_COST, U_TOOLS, U_ATTEMPTS, NU };
enum { L_ACTS, L_RES, L_N, L_SETTINGS, L_STALE, L_GBITS, L_GOFF, NL };
enum { F_N, F_SX, F_SY, F_SXX, F_SXY, F_LAST, NF };
static PyTypeObject *k_budget, *k_usage, *k_loop, *k_forecaster;
static Py_ssize_t off_b[NB], off_u[NU], off_l[NL], off_f[NF];
static PyObject *k_ok, *k_zero_f, *k_zero, *k_one, *s_locked, *s_window, *s_threshold;
/* the trigger points' fields (Triggers, _escalation.py) and the limits' the check reads */
enum { TR_LIMITS, TR_RANK, TR_STEPS, TR_MODEL_CALLS, TR_TOKENS, TR_TOKENS_RESERVE, TR_COST,
       TR_TOOL_CALLS, TR_ELAPSED, TR_ELAPSED_RESERVE, NTR };
static const char *const tr_names[NTR] = {"limits", "rank", "steps", "model_calls", "tokens",
                                          "tokens_reserve", "cost_usd", "tool_calls",
                                          "elapsed_s", "elapsed_reserve_s"};
static PyObject *s_tr[NTR], *s_deadline, *s_freezes, *k_inf;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The offset of a __slots__ member of `type` (a member descriptor holding an object). */
static int member_offset(PyObject *type, const char *name, Py_ssize_t *off) {
    PyObject *d = PyObject_GetAttrString(type, name);
    int ok;
    if (d == NULL) return -1;
    ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
         ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
    if (ok) *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) PyErr_Format(PyExc_TypeError, "%s is not a slot", name);
    return ok ? 0 : -1;
}

static int offsets(PyObject *type, const char *const *names, Py_ssize_t *out, int n) {
    int i;
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes classes");
        return -1;
    }
    for (i = 0; i < n; i++)
        if (member_offset(type, names[i], &out[i]) < 0) return -1;
    return 0;
}

/* bind(Budget, Usage, LoopDetector, Forecaster, ok_verdict) */
static PyObject *sp_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const nb[] = {"_usages",   "_seq",   "_lock",    "_limits",
                                     "_trig",     "_usage", "_reserved", "_clock",
                                     "_started",  "_paused_at", "_paused_total"};
    static const char *const nu[] = {"steps",         "model_calls",      "input_tokens",
                                     "output_tokens", "reasoning_tokens", "cached_tokens",
                                     "cost_usd",      "tool_calls",       "tool_attempts"};
    static const char *const nl[] = {"_acts", "_res", "_n", "settings", "_stale", "_gbits", "_goff"};
    static const char *const nf[] = {"_n", "_sx", "_sy", "_sxx", "_sxy", "_last"};
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "bind() takes 5 arguments");
        return NULL;
    }
    if (offsets(args[0], nb, off_b, NB) < 0 || offsets(args[1], nu, off_u, NU) < 0 ||
        offsets(args[2], nl, off_l, NL) < 0 || offsets(args[3], nf, off_f, NF) < 0)
        return NULL;
    if (k_zero_f == NULL) {
        k_zero_f = PyFloat_FromDouble(0.0);
        k_one = PyLong_FromLong(1);
        k_zero = PyLong_FromLong(0);
        s_locked = PyUnicode_InternFromString("locked");
        s_window = PyUnicode_InternFromString("window");
        s_threshold = PyUnicode_InternFromString("repeat_threshold");
        if (!k_zero_f || !k_zero || !k_one || !s_locked || !s_window || !s_threshold) return NULL;
        for (int i = 0; i < NTR; i++)
            if ((s_tr[i] = PyUnicode_InternFromString(tr_names[i])) == NULL) return NULL;
        s_deadline = PyUnicode_InternFromString("deadline_s");
        s_freezes = PyUnicode_InternFromString("pause_freezes_deadline");
        k_inf = PyFloat_FromDouble(Py_HUGE_VAL);
        if (!s_deadline || !s_freezes || !k_inf) return NULL;
    }
    Py_XSETREF(k_budget, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(k_usage, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(k_loop, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(k_forecaster, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(k_ok, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

/* slot += delta (Python's +=); 0, or -1 with an exception. */
static int slot_add(PyObject *o, Py_ssize_t off, PyObject *delta) {
    PyObject *v = SLOT(o, off), *sum;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "slot not set");
        return -1;
    }
    sum = PyNumber_InPlaceAdd(v, delta);
    if (sum == NULL) return -1;
    SLOT(o, off) = sum;
    Py_DECREF(v);
    return 0;
}

static void slot_set(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = Py_NewRef(v);
    Py_XDECREF(old);
}

/* u.cost_usd = (u.cost_usd or 0.0) + cost */
static int add_cost(PyObject *u, PyObject *cost) {
    PyObject *v = SLOT(u, off_u[U_COST]), *sum;
    int t;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cost_usd not set");
        return -1;
    }
    t = PyObject_IsTrue(v);
    if (t < 0) return -1;
    sum = PyNumber_Add(t ? v : k_zero_f, cost);
    if (sum == NULL) return -1;
    SLOT(u, off_u[U_COST]) = sum;
    Py_DECREF(v);
    return 0;
}

static int plain_count(PyObject *v) {
    return PyLong_CheckExact(v) && _PyLong_Sign(v) >= 0;
}

/* The budget's usages (itself and its ancestors) when it may be recorded into natively now:
 * exactly a Budget, bound, and its lock not held (another thread inside the lock would be
 * interleaved with; the Python method waits for it instead). NULL: refused (or an error). */
static PyObject *usages_of(PyObject *budget, PyObject *also) {
    PyObject *lock, *held, *usages;
    Py_ssize_t i;
    if (k_budget == NULL || !Py_IS_TYPE(budget, k_budget) || !Py_IS_TYPE(also, k_usage))
        return NULL;
    usages = SLOT(budget, off_b[B_USAGES]);
    lock = SLOT(budget, off_b[B_LOCK]);
    if (usages == NULL || lock == NULL || SLOT(budget, off_b[B_SEQ]) == NULL ||
        !PyTuple_CheckExact(usages))
        return NULL;
    for (i = 0; i < PyTuple_GET_SIZE(usages); i++)
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(usages, i), k_usage)) return NULL;
    held = PyObject_CallMethodNoArgs(lock, s_locked);
    if (held == NULL) return NULL;
    Py_DECREF(held);
    return held == Py_False ? usages : NULL;
}

/* budget_step(budget, also) -> seq | None: Budget.record_step(), then also.steps += 1. */
static PyObject *sp_budget_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *usages, *b;
    Py_ssize_t i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "budget_step() takes 2 arguments");
        return NULL;
    }
    b = args[0];
    usages = usages_of(b, args[1]);
    if (usages == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    for (i = 0; i < PyTuple_GET_SIZE(usages); i++)
        if (slot_add(PyTuple_GET_ITEM(usages, i), off_u[U_STEPS], k_one) < 0) return NULL;
    if (slot_add(b, off_b[B_SEQ], k_one) < 0) return NULL;
    if (slot_add(args[1], off_u[U_STEPS], k_one) < 0) return NULL;
    return Py_NewRef(SLOT(b, off_b[B_SEQ]));
}

/* The model-call counters of one usage, in Budget._add_model_call_locked's order. */
static int add_model(PyObject *u, PyObject *const *c, PyObject *cost) {
    int j;
    if (slot_add(u, off_u[U_MODEL_CALLS], k_one) < 0) return -1;
    for (j = 0; j < 4; j++)
        if (slot_add(u, off_u[U_IN + j], c[j]) < 0) return -1;
    return cost == Py_None ? 0 : add_cost(u, cost);
}

/* budget_model_call(budget, also, input, output, reasoning, cached, cost) -> seq | None:
 * Budget.record_model_call(...) of plain counts (exact ints >= 0) and a plain cost (None or
 * an exact finite float >= 0), then the same usage added to `also`. */
static PyObject *sp_budget_model_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *usages, *b, *cost;
    Py_ssize_t i;
    int j;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "budget_model_call() takes 7 arguments");
        return NULL;
    }
    for (j = 2; j < 6; j++)
        if (!plain_count(args[j])) Py_RETURN_NONE;
    cost = args[6];
    if (cost != Py_None) {
        double c;
        if (!PyFloat_CheckExact(cost)) Py_RETURN_NONE;
        c = PyFloat_AS_DOUBLE(cost);
        if (!(c >= 0.0 && c < Py_HUGE_VAL)) Py_RETURN_NONE;
    }
    b = args[0];
    usages = usages_of(b, args[1]);
    if (usages == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (slot_add(b, off_b[B_SEQ], k_one) < 0) return NULL;
    for (i = 0; i < PyTuple_GET_SIZE(usages); i++)
        if (add_model(PyTuple_GET_ITEM(usages, i), args + 2, cost) < 0) return NULL;
    if (add_model(args[1], args + 2, cost) < 0) return NULL;
    return Py_NewRef(SLOT(b, off_b[B_SEQ]));
}

/* budget_tool_calls(budget, also, n, attempts) -> seq | None:
 * Budget.record_tool_calls(n, attempts=attempts) of exact ints >= 0 and no cost, then
 * also.tool_calls += n and also.tool_attempts += attempts. */
static PyObject *sp_budget_tool_calls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *usages, *b, *u;
    Py_ssize_t i;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "budget_tool_calls() takes 4 arguments");
        return NULL;
    }
    if (!plain_count(args[2]) || !plain_count(args[3])) Py_RETURN_NONE;
    b = args[0];
    usages = usages_of(b, args[1]);
    if (usages == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    for (i = 0; i < PyTuple_GET_SIZE(usages); i++) {
        u = PyTuple_GET_ITEM(usages, i);
        if (slot_add(u, off_u[U_TOOLS], args[2]) < 0 || slot_add(u, off_u[U_ATTEMPTS], args[3]) < 0)
            return NULL;
    }
    if (slot_add(b, off_b[B_SEQ], k_one) < 0 || slot_add(args[1], off_u[U_TOOLS], args[2]) < 0 ||
        slot_add(args[1], off_u[U_ATTEMPTS], args[3]) < 0)
        return NULL;
    return Py_NewRef(SLOT(b, off_b[B_SEQ]));
}

/* 1 when `a op b` (Python's comparison), 0 when not, -1 on error. */
static int cmp(PyObject *a, PyObject *b, int op) { return PyObject_RichCompareBool(a, b, op); }

/* Budget._elapsed_locked(): a new reference, or NULL. */
static PyObject *elapsed_of(PyObject *b, PyObject *limits) {
    PyObject *now, *freezes, *x, *paused, *y;
    int f;
    now = PyObject_CallNoArgs(SLOT(b, off_b[B_CLOCK]));
    if (now == NULL) return NULL;
    freezes = PyObject_GetAttr(limits, s_freezes);
    f = freezes == NULL ? -1 : PyObject_IsTrue(freezes);
    Py_XDECREF(freezes);
    if (f < 0) goto fail;
    x = PyNumber_Subtract(now, SLOT(b, off_b[B_STARTED]));
    if (x == NULL) goto fail;
    if (f) {
        paused = Py_NewRef(SLOT(b, off_b[B_PAUSED_TOTAL]));
        if (SLOT(b, off_b[B_PAUSED_AT]) != Py_None) {
            PyObject *d = PyNumber_Subtract(now, SLOT(b, off_b[B_PAUSED_AT]));
            y = d == NULL ? NULL : PyNumber_InPlaceAdd(paused, d);
            Py_XDECREF(d);
            Py_DECREF(paused);
            paused = y;
        }
        y = paused == NULL ? NULL : PyNumber_Subtract(x, paused);
        Py_XDECREF(paused);
        Py_DECREF(x);
        x = y;
        if (x == NULL) goto fail;
    }
    Py_DECREF(now);
    f = cmp(x, k_zero_f, Py_GT); /* max(0.0, x) */
    if (f < 0) {
        Py_DECREF(x);
        return NULL;
    }
    if (!f) Py_SETREF(x, Py_NewRef(k_zero_f));
    return x;
fail:
    Py_DECREF(now);
    return NULL;
}

/* The check of Escalations._quiet_locked(rank) with the budget's current trigger points:
 * 1 quiet, 0 not (or not known here), -1 error. */
static int quiet_of(PyObject *b, PyObject *rank) {
    PyObject *limits = SLOT(b, off_b[B_LIMITS]), *t = SLOT(b, off_b[B_TRIG]), *tr[NTR];
    PyObject *u = SLOT(b, off_b[B_USAGE]), *r = SLOT(b, off_b[B_RESERVED]), *tokens = NULL;
    PyObject *deadline = NULL, *elapsed = NULL;
    int i, rc = 0, c;
    if (!limits || !t || !u || !r || !Py_IS_TYPE(u, k_usage) || !Py_IS_TYPE(r, k_usage))
        return 0;
    for (i = 0; i < NTR; i++) tr[i] = NULL;
    for (i = 0; i < NTR; i++)
        if ((tr[i] = PyObject_GetAttr(t, s_tr[i])) == NULL) goto done;
    /* stale trigger points (other limits or rank): the method recomputes them */
    if (tr[TR_LIMITS] != limits || (c = cmp(tr[TR_RANK], rank, Py_EQ)) <= 0) goto done;
    tokens = PyNumber_Add(SLOT(u, off_u[U_IN]), SLOT(u, off_u[U_OUT]));
    if (tokens == NULL) goto done;
#define FIRES(x, y) ((c = cmp((x), (y), Py_GE)) != 0) /* true on error too */
    if (FIRES(SLOT(u, off_u[U_STEPS]), tr[TR_STEPS]) ||
        FIRES(SLOT(u, off_u[U_MODEL_CALLS]), tr[TR_MODEL_CALLS]) ||
        FIRES(tokens, tr[TR_TOKENS]) || FIRES(SLOT(u, off_u[U_TOOLS]), tr[TR_TOOL_CALLS]))
        goto done;
    if ((c = cmp(tr[TR_TOKENS_RESERVE], k_inf, Py_NE)) != 0) {
        PyObject *held;
        if (c < 0) goto done;
        held = PyNumber_Add(SLOT(r, off_u[U_IN]), SLOT(r, off_u[U_OUT]));
        if (held == NULL) goto done;
        Py_SETREF(held, PyNumber_Add(tokens, held));
        if (held == NULL) goto done;
        c = cmp(held, tr[TR_TOKENS_RESERVE], Py_GE);
        Py_DECREF(held);
        if (c != 0) goto done;
    }
    if (SLOT(u, off_u[U_COST]) != Py_None && FIRES(SLOT(u, off_u[U_COST]), tr[TR_COST])) goto done;
    deadline = PyObject_GetAttr(limits, s_deadline);
    if (deadline == NULL) goto done;
    if (deadline == Py_None) { /* then the clock cannot make anything fire: not read */
        rc = 1;
        goto done;
    }
    elapsed = elapsed_of(b, limits);
    if (elapsed == NULL) goto done;
    if (FIRES(elapsed, tr[TR_ELAPSED]) || FIRES(elapsed, tr[TR_ELAPSED_RESERVE])) goto done;
    rc = 1;
#undef FIRES
done:
    for (i = 0; i < NTR; i++) Py_XDECREF(tr[i]);
    Py_XDECREF(tokens);
    Py_XDECREF(deadline);
    Py_XDECREF(elapsed);
    if (PyErr_Occurred()) return -1;
    return rc;
}

/* budget_quiet(budget, rank) -> True | None: True when Budget.escalation(above=<the action of
 * rank>) without a loop verdict is None for certain, by the check of _quiet_locked() on the
 * budget's trigger points as they are; None when that needs the method (its lock held, its
 * trigger points for other limits or another rank, a check that may fire). */
static PyObject *sp_budget_quiet(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *b, *lock, *held;
    int rc;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "budget_quiet() takes 2 arguments");
        return NULL;
    }
    b = args[0];
    if (k_budget == NULL || !Py_IS_TYPE(b, k_budget) || !PyLong_CheckExact(args[1]))
        Py_RETURN_NONE;
    for (rc = 0; rc < NB; rc++)
        if (SLOT(b, off_b[rc]) == NULL) Py_RETURN_NONE;
    lock = SLOT(b, off_b[B_LOCK]);
    held = PyObject_CallMethodNoArgs(lock, s_locked);
    if (held == NULL) return NULL;
    Py_DECREF(held);
    if (held != Py_False) Py_RETURN_NONE;
    rc = quiet_of(b, args[1]);
    if (rc < 0) return NULL;
    if (rc) Py_RETURN_TRUE;
    Py_RETURN_NONE;
}

/* The detector's rings and window when it is exactly a bound LoopDetector whose rings match
 * its settings (else 0: the Python method handles it). */
static int loop_rings(PyObject *d, Py_buffer *va, Py_buffer *vr, Py_ssize_t *w, Py_ssize_t *k) {
    PyObject *settings, *v;
    if (k_loop == NULL || !Py_IS_TYPE(d, k_loop)) return 0;
    settings = SLOT(d, off_l[L_SETTINGS]);
    if (settings == NULL || SLOT(d, off_l[L_N]) == NULL || !PyLong_CheckExact(SLOT(d, off_l[L_N])))
        return 0;
    v = PyObject_GetAttr(settings, s_window);
    if (v == NULL) return -1;
    *w = PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    v = PyObject_GetAttr(settings, s_threshold);
    if (v == NULL) return -1;
    *k = PyLong_CheckExact(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    if (PyErr_Occurred()) return -1;
    if (*w < 2 || *k < 2) return 0;
    if (SLOT(d, off_l[L_ACTS]) == NULL || SLOT(d, off_l[L_RES]) == NULL) return 0;
    if (PyObject_GetBuffer(SLOT(d, off_l[L_ACTS]), va, PyBUF_WRITABLE) < 0) return -1;
    if (PyObject_GetBuffer(SLOT(d, off_l[L_RES]), vr, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(va);
        return -1;
    }
    if (va->len != 8 * *w || vr->len != 8 * *w) {
        PyBuffer_Release(va);
        PyBuffer_Release(vr);
        return 0;
    }
    return 1;
}

/* loop_observe(detector, action, result) -> bool | None: LoopDetector.observe_action()'s
 * first half, as observe() above on the detector's own rings, with its call count advanced:
 * True when no pattern can fire (the verdict is CONTINUE), False when the caller must finish
 * with detector.judge_last(). None, with nothing written: the method handles it. */
static PyObject *sp_loop_observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer va, vr;
    Py_ssize_t w, k, slot, n;
    uint64_t a, r = 0;
    PyObject *result, *d, *nobj, *next;
    int rc, quiet;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "loop_observe() takes 3 arguments");
        return NULL;
    }
    d = args[0];
    result = args[2];
    if (!hex64(args[1], &a)) Py_RETURN_NONE;
    if (result != Py_None && !(PyUnicode_CheckExact(result) && PyUnicode_GET_LENGTH(result) == 0))
        if (!hex64(result, &r)) Py_RETURN_NONE;
    rc = loop_rings(d, &va, &vr, &w, &k);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    nobj = SLOT(d, off_l[L_N]);
    n = PyLong_AsSsize_t(nobj);
    next = n < 0 ? NULL : PyNumber_Add(nobj, k_one);
    if (next == NULL) {
        PyBuffer_Release(&va);
        PyBuffer_Release(&vr);
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    slot = n % w;
    memcpy((char *)va.buf + 8 * slot, &a, 8);
    memcpy((char *)vr.buf + 8 * slot, &r, 8);
    quiet = quiet_window(va.buf, vr.buf, w, slot, a, r, k - 1, k + 1);
    PyBuffer_Release(&va);
    PyBuffer_Release(&vr);
    SLOT(d, off_l[L_N]) = next;
    Py_DECREF(nobj);
    return PyBool_FromLong(quiet);
}

/* loop_end_step(detector, state, progress) -> verdict | None: LoopDetector.end_step() when
 * the step says nothing (no state, no progress signal: CONTINUE, nothing changes) or reports
 * progress without a state (the stale count restarts and the facts grew at this call count,
 * within the kept bits). None, with nothing changed, for every other step. */
static PyObject *sp_loop_end_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *d, *n, *goff, *gbits, *acts, *b, *bit, *merged;
    Py_ssize_t width;
    long long bv;
    int over;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "loop_end_step() takes 3 arguments");
        return NULL;
    }
    d = args[0];
    if (k_loop == NULL || !Py_IS_TYPE(d, k_loop) || args[1] != Py_None) Py_RETURN_NONE;
    if (args[2] == Py_None) return Py_NewRef(k_ok);
    if (args[2] != Py_True) Py_RETURN_NONE;
    n = SLOT(d, off_l[L_N]);
    goff = SLOT(d, off_l[L_GOFF]);
    gbits = SLOT(d, off_l[L_GBITS]);
    acts = SLOT(d, off_l[L_ACTS]);
    if (!n || !goff || !gbits || !acts || !PyLong_CheckExact(n) || !PyLong_CheckExact(goff) ||
        !PyLong_CheckExact(gbits) || SLOT(d, off_l[L_STALE]) == NULL)
        Py_RETURN_NONE;
    width = PyObject_Length(acts);
    if (width < 0) return NULL;
    bv = PyLong_AsLongLongAndOverflow(n, &over);
    if (!over) {
        long long g = PyLong_AsLongLongAndOverflow(goff, &over);
        bv -= g;
    }
    if (over || PyErr_Occurred() || bv >= 2 * (long long)width) Py_RETURN_NONE; /* _grown() */
    if (bv < 0) Py_RETURN_NONE;
    b = PyLong_FromLongLong(bv);
    if (b == NULL) return NULL;
    bit = PyNumber_Lshift(k_one, b);
    Py_DECREF(b);
    if (bit == NULL) return NULL;
    merged = PyNumber_Or(gbits, bit);
    Py_DECREF(bit);
    if (merged == NULL) return NULL;
    slot_set(d, off_l[L_STALE], k_zero);
    SLOT(d, off_l[L_GBITS]) = merged;
    Py_DECREF(gbits);
    return Py_NewRef(k_ok);
}

/* forecast_observe(forecaster, step_index, input_tokens) -> True | None: Forecaster.observe()
 * of an exact int step_index >= 1 and exact int input_tokens >= 0 (None: the method, which
 * raises, handles anything else). The sums are Python floats: float + int converts the int
 * as PyLong_AsDouble does, so the doubles here are the ones Python computes (no fused
 * multiply-add: each product is stored before it is added). */
static PyObject *sp_forecast_observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *f, *idx, *tok, *v[NF], *nv[NF];
    volatile double x, t, xx, xy; /* volatile: rounded to double at each step, as in Python */
    long long ix;
    int i, over;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "forecast_observe() takes 3 arguments");
        return NULL;
    }
    f = args[0], idx = args[1], tok = args[2];
    if (k_forecaster == NULL || !Py_IS_TYPE(f, k_forecaster) || !PyLong_CheckExact(idx) ||
        !plain_count(tok))
        Py_RETURN_NONE;
    ix = PyLong_AsLongLongAndOverflow(idx, &over);
    if (over || ix < 1 || ix > (1LL << 53)) Py_RETURN_NONE; /* float(ix - 1) is exact below */
    for (i = 0; i < NF; i++) {
        v[i] = SLOT(f, off_f[i]);
        if (v[i] == NULL) Py_RETURN_NONE;
    }
    if (!PyLong_CheckExact(v[F_N]) || !PyLong_CheckExact(v[F_LAST]) ||
        !PyFloat_CheckExact(v[F_SX]) || !PyFloat_CheckExact(v[F_SY]) ||
        !PyFloat_CheckExact(v[F_SXX]) || !PyFloat_CheckExact(v[F_SXY]))
        Py_RETURN_NONE;
    t = PyLong_AsDouble(tok);
    if (t == -1.0 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear(); /* Python raises OverflowError there too: the method's to answer */
        Py_RETURN_NONE;
    }
    x = (double)(ix - 1);
    xx = x * x;
    xy = x * t;
    nv[F_N] = PyNumber_Add(v[F_N], k_one);
    nv[F_SX] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SX]) + x);
    nv[F_SY] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SY]) + t);
    nv[F_SXX] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SXX]) + xx);
    nv[F_SXY] = PyFloat_FromDouble(PyFloat_AS_DOUBLE(v[F_SXY]) + xy);
    over = PyObject_RichCompareBool(idx, v[F_LAST], Py_GT); /* max(last, idx) keeps last */
    nv[F_LAST] = over > 0 ? Py_NewRef(idx) : Py_NewRef(v[F_LAST]);
    if (over < 0 || !nv[F_N] || !nv[F_SX] || !nv[F_SY] || !nv[F_SXX] || !nv[F_SXY]) {
        for (i = 0; i < NF; i++) Py_XDECREF(nv[i]);
        return NULL;
    }
    for (i = 0; i < NF; i++) {
        SLOT(f, off_f[i]) = nv[i];
        Py_DECREF(v[i]);
    }
    Py_RETURN_TRUE;
}

/* sha256(data: bytes) -> bytes: the plain digest (lets tests check the implementation). */
static PyObject *sp_sha256(PyObject *self, PyObject *arg) {
    sha_ctx c;
    uint8_t d[32];
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    sha_init(&c);
    sha_update(&c, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    sha_final(&c, d);
    return PyBytes_FromStringAndSize((const char *)d, 32);
}

static PyMethodDef methods[] = {
    {"action", (PyCFunction)(void (*)(void))sp_action, METH_FASTCALL,
     "action(inner, outer, args, ignore) -> fingerprint, or None outside the fast case"},
    {"result", (PyCFunction)(void (*)(void))sp_result, METH_FASTCALL,
     "result(inner, outer, value) -> hash, or None outside the fast case"},
    {"mac", (PyCFunction)(void (*)(void))sp_mac, METH_FASTCALL,
     "mac(inner, outer, payload) -> HMAC-SHA256 of the UTF-8 payload, 32 hex chars"},
    {"state", (PyCFunction)(void (*)(void))sp_state, METH_FASTCALL,
     "state(data, base=None) -> a SHA-256 state that has absorbed data"},
    {"observe", (PyCFunction)(void (*)(void))sp_observe, METH_FASTCALL,
     "observe(acts, res, slot, action, result, need_a, need_r) -> quiet, or None"},
    {"sha256", sp_sha256, METH_O, "sha256(data) -> digest"},
    {"bind", (PyCFunction)(void (*)(void))sp_bind, METH_FASTCALL,
     "bind(Budget, Usage, LoopDetector, Forecaster, ok) -> None: the record kernels' classes"},
    {"budget_step", (PyCFunction)(void (*)(void))sp_budget_step, METH_FASTCALL,
     "budget_step(budget, also) -> seq, or None (use Budget.record_step)"},
    {"budget_model_call", (PyCFunction)(void (*)(void))sp_budget_model_call, METH_FASTCALL,
     "budget_model_call(budget, also, in, out, reasoning, cached, cost) -> seq, or None"},
    {"budget_tool_calls", (PyCFunction)(void (*)(void))sp_budget_tool_calls, METH_FASTCALL,
     "budget_tool_calls(budget, also, n, attempts) -> seq, or None"},
    {"budget_quiet", (PyCFunction)(void (*)(void))sp_budget_quiet, METH_FASTCALL,
     "budget_quiet(budget, rank) -> True, or None (use Budget.escalation)"},
    {"loop_observe", (PyCFunction)(void (*)(void))sp_loop_observe, METH_FASTCALL,
     "loop_observe(detector, action, result) -> quiet, or None"},
    {"loop_end_step", (PyCFunction)(void (*)(void))sp_loop_end_step, METH_FASTCALL,
     "loop_end_step(detector, state, progress) -> verdict, or None"},
    {"forecast_observe", (PyCFunction)(void (*)(void))sp_forecast_observe, METH_FASTCALL,
     "forecast_observe(forecaster, step_index, input_tokens) -> True, or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "_speedups",
                                    "Native fast paths of guard.policy._fingerprint.",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
