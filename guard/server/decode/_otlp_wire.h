/* Part of _otlpnative.c (included once: one translation unit, so everything stays static).
 *
 * The protobuf wire primitives, strict UTF-8, and the validation of the OTLP messages the
 * native decoder does not read: each returns -1 for anything it does not accept, which makes
 * the whole request fall back to the reference decoder. */
#ifndef OTLP_WIRE_H
#define OTLP_WIRE_H

/* ---- wire primitives --------------------------------------------------------------- */
typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} rd;

/* Over-long (padded) varints, by protobuf's rule, which the reference (upb, behind the
 * generated classes) applies and this path must never be laxer than:
 * - a field value is a 64-bit number: at most 10 bytes, the 10th byte's bits beyond bit 63
 *   dropped (upb keeps the low 64 bits); an 11th byte is malformed;
 * - a tag or a length is a 32-bit number: at most 5 bytes, even when the extra bytes only pad
 *   a zero; a tag beyond 32 bits is malformed, and so is a length of INT32_MAX or more
 *   (upb's bound on a size).
 * Reading a tag or a length with the 10-byte rule would accept requests the reference
 * refuses, so each has its own reader. */

/* A varint of at most `bytes` bytes (10 or 5: a constant, so each reader is its own loop).
 * 0 on success; -1 when malformed (longer, or cut off by the end). */
static inline int varint_of(rd *r, int bytes, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 7 * bytes; shift += 7) {
        if (r->p >= r->end)
            return -1;
        unsigned char b = *r->p++;
        /* at shift 63 only the byte's lowest bit fits: the shift drops the rest, as upb does */
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A varint field value: at most 10 bytes, its low 64 bits. */
static inline int varint(rd *r, uint64_t *out) {
    return varint_of(r, 10, out);
}

/* A 32-bit varint (a tag or a length): at most 5 bytes, at most UINT32_MAX. */
static inline int varint32(rd *r, uint64_t *out) {
    uint64_t v;
    if (varint_of(r, 5, &v) < 0 || v > UINT32_MAX)
        return -1;
    *out = v;
    return 0;
}

/* A field's tag: 32 bits, as upb reads it (see above). */
static inline int wire_tag(rd *r, uint64_t *tag) {
    return varint32(r, tag);
}

/* A length-delimited field: [*start, *start + *len) inside the reader. */
static inline int delimited(rd *r, const unsigned char **start, Py_ssize_t *len) {
    uint64_t n;
    if (varint32(r, &n) < 0 || n >= (uint64_t)INT32_MAX || n > (uint64_t)(r->end - r->p))
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

/* A length-delimited field whose bytes are strict UTF-8 (a string field): 0, or -1. */
static inline int utf8_field(rd *r, const unsigned char **s, Py_ssize_t *len) {
    return delimited(r, s, len) < 0 || !utf8_ok(*s, *len, NULL) ? -1 : 0;
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

/* A length-delimited field holding a message `msg`, validated at `depth`: 0, or -1. */
static inline int message_field(rd *r, int msg, int depth) {
    const unsigned char *s;
    Py_ssize_t len;
    return delimited(r, &s, &len) < 0 ? -1 : validate(s, len, msg, depth);
}

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
        return wt == 2 ? utf8_field(r, &s, &len) : -1;
    case F_BYTES:
        return wt == 2 ? delimited(r, &s, &len) : -1;
    case F_MSG:
        return wt == 2 ? message_field(r, f.msg, depth + 1) : -1;
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
        if (wire_tag(&r, &tag) < 0)
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

#endif /* OTLP_WIRE_H */
