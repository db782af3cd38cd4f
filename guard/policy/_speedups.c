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
 * The fingerprint functions are pure computation: no I/O, no globals written after import,
 * safe under free threading of independent calls (states are immutable bytes, checked and
 * copied to the stack by each call). The record kernels (_kernels.h) write the policy's
 * objects: each takes the budget's own lock as its Python method does (without waiting: a
 * lock held elsewhere refuses), and bind() is called once, at import. The module still
 * declares that it needs the GIL (Py_mod_gil, 3.13): the kernels' slot reads and writes of
 * the loop detector and forecaster are not guarded by a lock of theirs, exactly like the
 * Python methods they replace, which rely on the caller's serialisation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "_native_common.h"
#include "_slots.h"

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

/* A state travels through Python as an immutable bytes object holding one sha_ctx. Its
 * fields are checked, not only its size (a forged state must not make sha_update write past
 * buf): what is pending in buf is the absorbed length's remainder, below one block. */
static int get_ctx(PyObject *o, sha_ctx *c) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != (Py_ssize_t)sizeof(sha_ctx)) {
        PyErr_SetString(PyExc_TypeError, "not a state made by _speedups.state()");
        return -1;
    }
    memcpy(c, PyBytes_AS_STRING(o), sizeof(sha_ctx));
    if (c->buflen >= 64 || c->buflen != (uint32_t)(c->len & 63) || c->len >> 61) {
        PyErr_SetString(PyExc_ValueError, "not a state made by _speedups.state()");
        return -1;
    }
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
static PyObject *sp_action(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    PyObject *d, *ignore, *k, *v;
    Py_ssize_t pos = 0, n = 0, i, j;
    entry e[MAX_KEYS], tmp;
    char keybuf[MAX_KEYS][64];
    sha_ctx inner;
    obuf b;
    int rc;
    if (!guard_nargs("action", nargs, 4)) return NULL;
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
static PyObject *sp_result(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    sha_ctx inner;
    obuf b;
    int rc;
    if (!guard_nargs("result", nargs, 3)) return NULL;
    if (get_ctx(args[0], &inner) < 0) return NULL;
    ob_init(&b);
    rc = put_scalar(&b, args[2]);
    return finish_buffer(rc, &b, &inner, args[1]);
}

/* mac(inner, outer, payload: str) -> str: HMAC of the UTF-8 payload, 32 hex chars. */
static PyObject *sp_mac(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *sp_state(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
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

/* A call's action fingerprint and result hash as ring values (*r 0 when the result is not
 * known: None or ""): 1, or 0 when either is not canonical (for the reference to handle). */
static int call_values(PyObject *action, PyObject *result, uint64_t *a, uint64_t *r) {
    *r = 0;
    if (!hex64(action, a)) return 0;
    if (result == Py_None || (PyUnicode_CheckExact(result) && PyUnicode_GET_LENGTH(result) == 0))
        return 1;
    return hex64(result, r);
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

/* Writable views of the two rings (acts, res): 0, or -1 with an exception and neither held. */
static int rings_get(PyObject *acts, PyObject *res, Py_buffer *va, Py_buffer *vr) {
    if (PyObject_GetBuffer(acts, va, PyBUF_WRITABLE) < 0) return -1;
    if (PyObject_GetBuffer(res, vr, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(va);
        return -1;
    }
    return 0;
}

static void rings_release(Py_buffer *va, Py_buffer *vr) {
    PyBuffer_Release(va);
    PyBuffer_Release(vr);
}

/* The call (a, r) written into slot `slot` of the two rings (n slots each); then: can no
 * pattern fire? Repeats and cycles need this action at least need_a times in the window (a
 * cycle's current call recurs once per period); same_result needs this (known) result in
 * need_r calls in a row, the newest included. */
static int quiet_window(char *acts, char *res, Py_ssize_t n, Py_ssize_t slot, uint64_t a,
                        uint64_t r, Py_ssize_t need_a, Py_ssize_t need_r) {
    memcpy(acts + 8 * slot, &a, 8);
    memcpy(res + 8 * slot, &r, 8);
    return count64(acts, n, a) < need_a && (!r || streak64(res, n, slot, r) < need_r);
}

/* observe(acts, res, slot, action, result, need_a, need_r) -> bool | None
 * LoopDetector.observe_action()'s first half: writes the call into slot `slot` of the two
 * rings (array('Q') of the same length) and returns True when no pattern can fire (the
 * action occurs fewer than need_a times and the result, when known, ends a run of fewer than
 * need_r equal results: see quiet_window),
 * False when the full check must run. None, with nothing written: not a canonical
 * fingerprint, for the reference to handle. */
static PyObject *sp_observe(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer va, vr;
    Py_ssize_t slot, need_a, need_r, n;
    uint64_t a, r;
    PyObject *res = NULL;
    if (!guard_nargs("observe", nargs, 7)) return NULL;
    if (!call_values(args[3], args[4], &a, &r)) Py_RETURN_NONE;
    slot = PyLong_AsSsize_t(args[2]);
    need_a = PyLong_AsSsize_t(args[5]);
    need_r = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL; /* before anything is written */
    if (rings_get(args[0], args[1], &va, &vr) < 0) return NULL;
    n = va.len / 8;
    if (va.len != vr.len || va.len % 8 || slot < 0 || slot >= n) {
        PyErr_SetString(PyExc_ValueError, "observe(): rings of unequal size or slot out of range");
    } else {
        res = PyBool_FromLong(quiet_window(va.buf, vr.buf, n, slot, a, r, need_a, need_r));
    }
    rings_release(&va, &vr);
    return res;
}

#include "_kernels.h" /* the record kernels (one translation unit with this file) */

/* sha256(data: bytes) -> bytes: the plain digest (lets tests check the implementation). */
static PyObject *sp_sha256(PyObject *Py_UNUSED(self), PyObject *arg) {
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
    GUARD_FASTCALL("action", sp_action,
        "action(inner, outer, args, ignore) -> fingerprint, or None outside the fast case"),
    GUARD_FASTCALL("result", sp_result,
        "result(inner, outer, value) -> hash, or None outside the fast case"),
    GUARD_FASTCALL("mac", sp_mac,
        "mac(inner, outer, payload) -> HMAC-SHA256 of the UTF-8 payload, 32 hex chars"),
    GUARD_FASTCALL("state", sp_state,
        "state(data, base=None) -> a SHA-256 state that has absorbed data"),
    GUARD_FASTCALL("observe", sp_observe,
        "observe(acts, res, slot, action, result, need_a, need_r) -> quiet, or None"),
    {"sha256", sp_sha256, METH_O, "sha256(data) -> digest"},
    GUARD_FASTCALL("bind", sp_bind,
        "bind(Budget, Usage, LoopDetector, Forecaster, ok) -> None: the record kernels' classes"),
    GUARD_FASTCALL("budget_step", sp_budget_step,
        "budget_step(budget, also) -> seq, or None (use Budget.record_step)"),
    GUARD_FASTCALL("budget_model_call", sp_budget_model_call,
        "budget_model_call(budget, also, in, out, reasoning, cached, cost) -> seq, or None"),
    GUARD_FASTCALL("budget_tool_calls", sp_budget_tool_calls,
        "budget_tool_calls(budget, also, n, attempts) -> seq, or None"),
    GUARD_FASTCALL("budget_quiet", sp_budget_quiet,
        "budget_quiet(budget, rank) -> True, or None (use Budget.escalation)"),
    GUARD_FASTCALL("loop_observe", sp_loop_observe,
        "loop_observe(detector, action, result) -> quiet, or None"),
    GUARD_FASTCALL("loop_end_step", sp_loop_end_step,
        "loop_end_step(detector, state, progress) -> verdict, or None"),
    GUARD_FASTCALL("forecast_observe", sp_forecast_observe,
        "forecast_observe(forecaster, step_index, input_tokens) -> True, or None"),
    {NULL, NULL, 0, NULL}};

/* Multi-phase initialisation (PEP 489). The record kernels' bound classes and offsets are
 * process-wide (bind() is called once, by guard/policy/_kernels.py), so the module is one
 * per process: not loaded into subinterpreters, and it keeps the GIL (3.13 free threading). */
static PyModuleDef_Slot module_slots[] = {GUARD_SLOTS_ONE_PER_PROCESS {0, NULL}};

GUARD_MODULE(_speedups, "Native fast paths of guard.policy._fingerprint.", methods, module_slots)
