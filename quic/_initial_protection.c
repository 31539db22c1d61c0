/* quic._initial_protection: a client Initial's keys and its opening, over OpenSSL's libcrypto;
 * and the ClientHello facts of a usual first Initial payload or of a whole handshake message.
 *
 * What it owns: libcrypto's SHA-256, AES-128-ECB and AES-128-GCM contexts, fetched once and
 * re-keyed per call; nothing else outlives a call (no Python object is kept but the error type).
 * What it must never do: block (no I/O; every call is bounded by its input's length), keep a
 * borrowed reference past a call that may run Python code, or trust a caller's offsets, lengths
 * or limits. Every entry point checks its own arguments: a position outside the datagram, a key
 * of the wrong size or a negative limit raises quic.packet.QuicPacketError (quic/'s one error
 * type, looked up by name: ATTRIBUTES), whatever the Python caller checked first.
 *
 * Why C: the router opens one client Initial per new QUIC connection, in a process whose caches
 * the peers have just evicted. Through `cryptography` and `hashlib` that is a dozen OpenSSL
 * objects made and fetched from the provider per connection (a fresh cipher context per AESGCM
 * and Cipher object, a digest context per hash object), which costs 6-9x its warm time there
 * (bench/README, "Where the router's CPU per QUIC connection goes"). Here SHA-256,
 * AES-128-ECB and AES-128-GCM are fetched once and their contexts re-keyed per connection.
 * No primitive is written here: HMAC is RFC 2104's two hashes, HKDF RFC 5869's two HMAC
 * steps, the rest is RFC 9001 section 5.4 (header protection) and 5.3 (AEAD nonce), the same
 * steps as quic/initial_keys.py, which stays the reference and the fallback (differential tests
 * and the fuzzer compare the two, never C with C).
 *
 * The GIL is held throughout, so the shared contexts need no lock; `--workers` are processes.
 * A datagram that does not authenticate returns None.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/evp.h>

#define KEY_BYTES       16
#define IV_BYTES        12
#define HP_BYTES        16
#define TAG_BYTES       16
#define SAMPLE_BYTES    16
#define MAX_PN_BYTES    4
#define SHA256_BYTES    32
#define STACK_AAD_BYTES 256                /* a long header without a big token fits; longer ones use the heap */
#define PN_LIMIT        ((int64_t)1 << 62) /* RFC 9000 section 12.3: packet numbers are below 2^62 */
#define QUIC_V1         0x00000001u        /* RFC 9000 */
#define QUIC_V2         0x6b3343cfu        /* RFC 9369 */
#define MAX_CID_BYTES   20                 /* RFC 9000 section 17.2: a v1/v2 connection ID is at most 20 bytes */
#define HMAC_KEY_BYTES  64                 /* SHA-256's block: the longest HMAC key taken as it is */

/* The attributes of Python objects this file reads by name (owner, name): the one list of them,
 * exported as ATTRIBUTES and checked against the Python side by tests/process/test_c_attributes.py. */
enum { QUIC_PACKET_ERROR, ATTRIBUTE_COUNT };
static const char *const attribute_table[ATTRIBUTE_COUNT][2] = {
    [QUIC_PACKET_ERROR] = { "quic.packet", "QuicPacketError" },
};

static const EVP_MD *sha256;    /* fetched once */
static EVP_MD_CTX *digest;      /* re-initialised by each hash of an HMAC */
static EVP_CIPHER_CTX *aes_ecb; /* header protection mask */
static EVP_CIPHER_CTX *aes_gcm; /* payload */

static int
setup_contexts(void)
{
    sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    digest = EVP_MD_CTX_new();
    if (sha256 == NULL || digest == NULL)
        return 0;

    EVP_CIPHER *ecb = EVP_CIPHER_fetch(NULL, "AES-128-ECB", NULL);
    EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
    aes_ecb = EVP_CIPHER_CTX_new();
    aes_gcm = EVP_CIPHER_CTX_new();
    int ok = ecb != NULL && gcm != NULL && aes_ecb != NULL && aes_gcm != NULL &&
             EVP_EncryptInit_ex2(aes_ecb, ecb, NULL, NULL, NULL) && EVP_CIPHER_CTX_set_padding(aes_ecb, 0) &&
             EVP_DecryptInit_ex2(aes_gcm, gcm, NULL, NULL, NULL);
    EVP_CIPHER_free(ecb); /* the contexts keep their own references */
    EVP_CIPHER_free(gcm);
    return ok;
}

#define SHA256_BLOCK_BYTES 64

/* SHA-256(pad XOR key, msg) into out: one hash of an HMAC, on the reused digest context. */
static int
padded_hash(const unsigned char *key, size_t key_len, unsigned char pad, const unsigned char *msg, size_t msg_len,
            unsigned char out[SHA256_BYTES])
{
    unsigned char block[SHA256_BLOCK_BYTES];
    memset(block, pad, sizeof block);
    for (size_t i = 0; i < key_len; i++)
        block[i] ^= key[i];
    unsigned int n = 0;
    return EVP_DigestInit_ex2(digest, sha256, NULL) && EVP_DigestUpdate(digest, block, sizeof block) &&
           EVP_DigestUpdate(digest, msg, msg_len) && EVP_DigestFinal_ex(digest, out, &n) && n == SHA256_BYTES;
}

/* HMAC-SHA256(key, msg) into out (32 bytes), RFC 2104's two hashes over libcrypto's SHA-256 (a key
 * longer than a block, which HKDF here never has, is refused); 0 on a libcrypto failure. Not
 * EVP_MAC: its every re-key copies digest contexts, a malloc and a free each, which a process
 * whose caches the peers evicted pays dearly for. */
static int
hmac(const unsigned char *key, size_t key_len, const unsigned char *msg, size_t msg_len,
     unsigned char out[SHA256_BYTES])
{
    unsigned char inner[SHA256_BYTES];
    return key_len <= SHA256_BLOCK_BYTES && padded_hash(key, key_len, 0x36, msg, msg_len, inner) &&
           padded_hash(key, key_len, 0x5c, inner, SHA256_BYTES, out);
}

static PyObject *
crypto_failure(const char *what)
{
    ERR_clear_error();
    PyErr_Format(PyExc_RuntimeError, "libcrypto failed in %s", what);
    return NULL;
}

/* quic.packet.QuicPacketError with `message` (ValueError if that module cannot be imported);
 * looked up on the first refusal, not at import: quic.packet imports this module. */
static PyObject *
refuse(const char *message)
{
    static PyObject *error_type;
    if (error_type == NULL) {
        PyObject *owner = PyImport_ImportModule(attribute_table[QUIC_PACKET_ERROR][0]);
        if (owner != NULL) {
            error_type = PyObject_GetAttrString(owner, attribute_table[QUIC_PACKET_ERROR][1]);
            Py_DECREF(owner);
        }
        if (error_type == NULL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, message);
            return NULL;
        }
    }
    PyErr_SetString(error_type, message);
    return NULL;
}

/* A ClientHello or CRYPTO limit as Python passed it: 1 with *out set, 0 with QuicPacketError set. */
static int
limit(long long value, uint64_t *out)
{
    if (value < 0) {
        refuse("a ClientHello or CRYPTO limit is not negative");
        return 0;
    }
    *out = (uint64_t)value;
    return 1;
}

/* Whether [offset, end) of a datagram of `size` bytes holds an Initial whose packet number is at
 * pn_offset, with room for the longest packet number and the header protection sample (RFC 9001
 * section 5.4.2) and no more than libcrypto takes in one call; no comparison can overflow,
 * whatever the caller passed. */
static int
positions_fit(Py_ssize_t size, Py_ssize_t offset, Py_ssize_t pn_offset, Py_ssize_t end)
{
    return offset >= 0 && pn_offset > offset && end >= 0 && end <= size &&
           end - MAX_PN_BYTES - SAMPLE_BYTES >= pn_offset && end - offset <= INT_MAX;
}

PyDoc_STRVAR(initial_keys_doc,
             "initial_keys(salt, dcid, secret_info, key_info, iv_info, hp_info) -> (key, iv, hp)\n\n"
             "HKDF-Extract(salt, dcid), HKDF-Expand of the direction's secret with ``secret_info``, then of\n"
             "the key, IV and header protection key with their ``*_info`` (each an HkdfLabel followed by the\n"
             "block counter 1: one HMAC block each, so no output is longer than 32 bytes).");

/* HKDF-Extract(salt, dcid), then HKDF-Expand of the direction's secret and of its key, IV and hp
 * key (each output the first bytes of one 32-byte block); 0 on a libcrypto failure. */
static int
derive_keys(const Py_buffer *salt, const unsigned char *dcid, size_t dcid_len, const Py_buffer *secret_info,
            const Py_buffer *key_info, const Py_buffer *iv_info, const Py_buffer *hp_info,
            unsigned char key[SHA256_BYTES], unsigned char iv[SHA256_BYTES], unsigned char hp[SHA256_BYTES])
{
    unsigned char initial_secret[SHA256_BYTES], secret[SHA256_BYTES];
    return hmac(salt->buf, (size_t)salt->len, dcid, dcid_len, initial_secret) &&
           hmac(initial_secret, SHA256_BYTES, secret_info->buf, (size_t)secret_info->len, secret) &&
           hmac(secret, SHA256_BYTES, key_info->buf, (size_t)key_info->len, key) &&
           hmac(secret, SHA256_BYTES, iv_info->buf, (size_t)iv_info->len, iv) &&
           hmac(secret, SHA256_BYTES, hp_info->buf, (size_t)hp_info->len, hp);
}

static PyObject *
initial_keys(PyObject *self, PyObject *args)
{
    Py_buffer salt, dcid, secret_info, key_info, iv_info, hp_info;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*:initial_keys", &salt, &dcid, &secret_info, &key_info, &iv_info, &hp_info))
        return NULL;
    unsigned char key[SHA256_BYTES], iv[SHA256_BYTES], hp[SHA256_BYTES];
    int salt_fits = salt.len <= HMAC_KEY_BYTES;
    int ok = salt_fits &&
             derive_keys(&salt, dcid.buf, (size_t)dcid.len, &secret_info, &key_info, &iv_info, &hp_info, key, iv, hp);
    PyBuffer_Release(&salt);
    PyBuffer_Release(&dcid);
    PyBuffer_Release(&secret_info);
    PyBuffer_Release(&key_info);
    PyBuffer_Release(&iv_info);
    PyBuffer_Release(&hp_info);
    if (!salt_fits)
        return refuse("an Initial salt is at most 64 bytes");
    if (!ok)
        return crypto_failure("initial_keys");
    return Py_BuildValue("(y#y#y#)", key, (Py_ssize_t)KEY_BYTES, iv, (Py_ssize_t)IV_BYTES, hp, (Py_ssize_t)HP_BYTES);
}

/* RFC 9000 appendix A.3, as quic.initial_keys.decode_packet_number. */
static int64_t
decode_packet_number(int64_t truncated, int pn_bits, int64_t largest_pn)
{
    int64_t expected = largest_pn + 1;
    int64_t win = (int64_t)1 << pn_bits;
    int64_t hwin = win >> 1;
    int64_t candidate = (expected & ~(win - 1)) | truncated;
    if (candidate <= expected - hwin && candidate < PN_LIMIT - win)
        return candidate + win;
    if (candidate > expected + hwin && candidate >= win)
        return candidate - win;
    return candidate;
}

PyDoc_STRVAR(
    open_initial_doc,
    "open_initial(datagram, key, iv, hp, offset, pn_offset, end, largest_pn) -> (packet_number, payload) | None\n\n"
    "Remove header protection from the Initial whose first byte is at ``offset``, whose packet number\n"
    "is at ``pn_offset`` and which ends at ``end``, then open its payload; None if it does not\n"
    "authenticate. QuicPacketError for positions or key sizes the caller should not have passed.");

/* Header protection off the Initial at `offset` of `d` (its packet number at `pn_offset`, its end at
 * `end`, positions its entry point checked with positions_fit), then its payload opened into a new
 * bytes object: 1 with *packet_number and *payload set, 0 if it does not authenticate, -1 with a
 * Python error set. */
static int
open_packet(const unsigned char *d, Py_ssize_t offset, Py_ssize_t pn_offset, Py_ssize_t end, int64_t largest_pn,
            const unsigned char *key, const unsigned char *iv, const unsigned char *hp, int64_t *packet_number,
            PyObject **payload)
{
    unsigned char mask[SAMPLE_BYTES];
    int n = 0;
    if (!EVP_EncryptInit_ex2(aes_ecb, NULL, hp, NULL, NULL) ||
        !EVP_EncryptUpdate(aes_ecb, mask, &n, d + pn_offset + MAX_PN_BYTES, SAMPLE_BYTES) || n != SAMPLE_BYTES) {
        crypto_failure("header protection");
        return -1;
    }
    unsigned char first = d[offset] ^ (mask[0] & 0x0F); /* long header: 4 protected bits */
    int pn_length = (first & 0x03) + 1;
    unsigned char pn_bytes[MAX_PN_BYTES];
    int64_t truncated = 0;
    for (int i = 0; i < pn_length; i++) {
        pn_bytes[i] = d[pn_offset + i] ^ mask[1 + i];
        truncated = (truncated << 8) | pn_bytes[i];
    }
    *packet_number = decode_packet_number(truncated, pn_length * 8, largest_pn);

    unsigned char nonce[IV_BYTES];
    memcpy(nonce, iv, IV_BYTES);
    for (int i = 0; i < 8; i++)
        nonce[IV_BYTES - 1 - i] ^= (unsigned char)((uint64_t)*packet_number >> (8 * i));

    unsigned char stack_aad[STACK_AAD_BYTES];
    Py_ssize_t aad_len = pn_offset + pn_length - offset;
    unsigned char *aad = aad_len <= STACK_AAD_BYTES ? stack_aad : PyMem_Malloc((size_t)aad_len);
    if (aad == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(aad, d + offset, (size_t)(aad_len - pn_length));
    aad[0] = first;
    memcpy(aad + aad_len - pn_length, pn_bytes, (size_t)pn_length);

    /* pn_offset + 4 + 16 <= end: at least a tag's worth of bytes follows the packet number. */
    const unsigned char *sealed = d + pn_offset + pn_length;
    Py_ssize_t plain_len = end - (pn_offset + pn_length) - TAG_BYTES;
    int status = -1, written = 0, last = 0;
    PyObject *plain = PyBytes_FromStringAndSize(NULL, plain_len);
    if (plain == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(plain);
    if (!EVP_DecryptInit_ex2(aes_gcm, NULL, key, nonce, NULL) ||
        !EVP_DecryptUpdate(aes_gcm, NULL, &n, aad, (int)aad_len) ||
        !EVP_DecryptUpdate(aes_gcm, out, &written, sealed, (int)plain_len) ||
        !EVP_CIPHER_CTX_ctrl(aes_gcm, EVP_CTRL_AEAD_SET_TAG, TAG_BYTES, (void *)(sealed + plain_len))) {
        Py_DECREF(plain);
        crypto_failure("AEAD");
        goto done;
    }
    if (EVP_DecryptFinal_ex(aes_gcm, out + written, &last) <= 0) { /* the tag did not match */
        Py_DECREF(plain);
        ERR_clear_error();
        status = 0;
        goto done;
    }
    *payload = plain;
    status = 1;
done:
    if (aad != stack_aad)
        PyMem_Free(aad);
    return status;
}

static PyObject *
open_initial(PyObject *self, PyObject *args)
{
    Py_buffer datagram, key, iv, hp;
    Py_ssize_t offset, pn_offset, end;
    long long largest_pn;
    if (!PyArg_ParseTuple(args, "y*y*y*y*nnnL:open_initial", &datagram, &key, &iv, &hp, &offset, &pn_offset, &end,
                          &largest_pn))
        return NULL;
    PyObject *result = NULL, *payload = NULL;
    int64_t packet_number = 0;
    if (key.len != KEY_BYTES || iv.len != IV_BYTES || hp.len != HP_BYTES) {
        refuse("Initial keys are a 16-byte key, a 12-byte IV and a 16-byte hp key");
    } else if (!positions_fit(datagram.len, offset, pn_offset, end)) {
        refuse("Initial positions out of the datagram");
    } else if (largest_pn < -1 || largest_pn >= PN_LIMIT) {
        refuse("the largest packet number is -1 (none) or below 2^62");
    } else {
        int opened = open_packet(datagram.buf, offset, pn_offset, end, (int64_t)largest_pn, key.buf, iv.buf, hp.buf,
                                 &packet_number, &payload);
        if (opened == 0)
            result = Py_NewRef(Py_None);
        else if (opened > 0)
            result = Py_BuildValue("(LN)", (long long)packet_number, payload);
    }
    PyBuffer_Release(&datagram);
    PyBuffer_Release(&key);
    PyBuffer_Release(&iv);
    PyBuffer_Release(&hp);
    return result;
}

/* ---- The first Initial's ClientHello, when it is all there: the common case, in one call ----
 * Everything below only ever answers "here it is" or "not simple" (None): any error, any
 * unusual shape (CRYPTO out of order or overlapping, another packet coalesced after this one,
 * a hello spread over datagrams) goes back to quic/initial_sniffer.py, which reads it the
 * reference way and raises the precise error. So a success must be exactly the Python path's
 * answer (tests/quic/test_quic_initial_native.py checks that on hostile bytes); a None costs only time. */

typedef struct {
    const unsigned char *p;
    size_t n;
} span;

/* QUIC varint at *pos; 0 if truncated. */
static int
varint(span s, size_t *pos, uint64_t *value)
{
    if (*pos >= s.n)
        return 0;
    size_t size = (size_t)1 << (s.p[*pos] >> 6);
    if (size > s.n - *pos)
        return 0;
    uint64_t v = s.p[*pos] & 0x3F;
    for (size_t i = 1; i < size; i++)
        v = (v << 8) | s.p[*pos + i];
    *pos += size;
    *value = v;
    return 1;
}

/* Big-endian length prefix of `bytes` bytes at *pos, then a sub-span of that length; 0 if truncated. */
static int
vector(span s, size_t *pos, size_t bytes, span *out)
{
    if (bytes > s.n - *pos)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < bytes; i++)
        n = (n << 8) | s.p[*pos + i];
    *pos += bytes;
    if (n > s.n - *pos)
        return 0;
    out->p = s.p + *pos;
    out->n = n;
    *pos += n;
    return 1;
}

#define MAX_CRYPTO_PIECES 16 /* CRYPTO frames of one first payload read here; more go the reference way */

/* RFC 9000 section 12.4: PADDING, PING, ACK, CRYPTO, CONNECTION_CLOSE; CRYPTO frames in order from
 * offset 0, each starting where the last ended. On success `pieces` (pointing into the payload)
 * hold the CRYPTO stream's first `*have` bytes, in `*count` pieces. */
static int
initial_crypto(span payload, uint64_t max_crypto, span pieces[MAX_CRYPTO_PIECES], int *count, uint64_t *have)
{
    size_t pos = 0;
    *count = 0;
    *have = 0;
    while (pos < payload.n) {
        if (payload.p[pos] == 0x00) { /* PADDING */
            pos++;
            continue;
        }
        uint64_t type, a, b, c;
        if (!varint(payload, &pos, &type))
            return 0;
        if (type == 0x01)
            continue;       /* PING */
        if (type == 0x06) { /* CRYPTO */
            if (!varint(payload, &pos, &a) || !varint(payload, &pos, &b))
                return 0;
            if (b > payload.n - pos || a != *have || a + b > max_crypto)
                return 0;
            if (b) {
                if (*count == MAX_CRYPTO_PIECES)
                    return 0;
                pieces[(*count)++] = (span){ payload.p + pos, (size_t)b };
                *have += b;
            }
            pos += (size_t)b;
        } else if (type == 0x02 || type == 0x03) { /* ACK, ACK_ECN */
            uint64_t count_of_ranges;
            if (!varint(payload, &pos, &a) || !varint(payload, &pos, &b) || !varint(payload, &pos, &count_of_ranges) ||
                !varint(payload, &pos, &c))
                return 0;
            if (count_of_ranges > (payload.n - pos) / 2)
                return 0;
            for (uint64_t i = 0; i < count_of_ranges; i++)
                if (!varint(payload, &pos, &a) || !varint(payload, &pos, &b))
                    return 0;
            if (type == 0x03)
                for (int i = 0; i < 3; i++)
                    if (!varint(payload, &pos, &a))
                        return 0;
        } else if (type == 0x1C) { /* CONNECTION_CLOSE */
            if (!varint(payload, &pos, &a) || !varint(payload, &pos, &b) || !varint(payload, &pos, &c))
                return 0;
            if (c > payload.n - pos)
                return 0;
            pos += (size_t)c;
        } else {
            return 0;
        }
    }
    return *count > 0;
}

/* wire/client_hello.py's parse_client_hello over a complete message; 0 if it would raise. */
/* wire/client_hello.py's _parse_max_idle_timeout over the quic_transport_parameters extension's body
 * (RFC 9000 section 18): every parameter's id and length well-formed, max_idle_timeout (0x01) at most
 * once and one varint filling its value. 1 with *idle set (0 when absent), 0 if it would raise. */
static int
max_idle_timeout(span body, uint64_t *idle)
{
    size_t pos = 0;
    int found = 0;
    *idle = 0;
    while (pos < body.n) {
        uint64_t id, length;
        if (!varint(body, &pos, &id) || !varint(body, &pos, &length) || length > body.n - pos)
            return 0;
        span value = { body.p + pos, (size_t)length };
        pos += (size_t)length;
        if (id != 0x01)
            continue;
        size_t at = 0;
        if (found || !varint(value, &at, idle) || at != value.n)
            return 0;
        found = 1;
    }
    return 1;
}

static int
client_hello(span hello, PyObject **server_name, PyObject **alpn, uint64_t *max_idle)
{
    size_t pos = 4, n;
    span v, extensions;
    if (hello.n < pos + 2 + 32)
        return 0; /* legacy_version, random */
    pos += 2 + 32;
    if (!vector(hello, &pos, 1, &v) || v.n > 32)
        return 0; /* legacy_session_id */
    if (!vector(hello, &pos, 2, &v) || v.n < 2 || v.n % 2)
        return 0; /* cipher_suites */
    if (!vector(hello, &pos, 1, &v) || v.n < 1)
        return 0; /* legacy_compression_methods */
    *max_idle = 0;
    *server_name = Py_NewRef(Py_None);
    *alpn = PyTuple_New(0);
    if (*alpn == NULL)
        return -1;
    if (pos == hello.n)
        return 1; /* no extensions (TLS 1.2) */
    if (!vector(hello, &pos, 2, &extensions) || pos != hello.n)
        return 0;
    unsigned char seen[65536 / 8]; /* extension types met: on the stack, so a nested call cannot share it */
    memset(seen, 0, sizeof seen);
    size_t at = 0;
    while (at < extensions.n) {
        if (extensions.n - at < 4)
            return 0;
        unsigned int type = ((unsigned int)extensions.p[at] << 8) | extensions.p[at + 1];
        n = ((size_t)extensions.p[at + 2] << 8) | extensions.p[at + 3];
        at += 4;
        if (n > extensions.n - at)
            return 0;
        if (seen[type >> 3] & (1u << (type & 7)))
            return 0;
        seen[type >> 3] |= (unsigned char)(1u << (type & 7));
        span body = { extensions.p + at, n }, list;
        size_t b = 0, l = 0;
        at += n;
        if (type == 0) { /* server_name: at most one host_name */
            if (!vector(body, &b, 2, &list) || b != body.n)
                return 0;
            PyObject *host = NULL;
            while (l < list.n) {
                unsigned char name_type = list.p[l++];
                span name;
                if (!vector(list, &l, 2, &name)) {
                    Py_XDECREF(host);
                    return 0;
                }
                if (name_type != 0)
                    continue;
                if (host != NULL) {
                    Py_DECREF(host);
                    return 0;
                }
                host = PyUnicode_DecodeASCII((const char *)name.p, (Py_ssize_t)name.n, "replace");
                if (host == NULL)
                    return -1;
            }
            if (host != NULL)
                Py_SETREF(*server_name, host);
        } else if (type == 16) { /* ALPN: a non-empty list of non-empty names */
            if (!vector(body, &b, 2, &list) || b != body.n)
                return 0;
            PyObject *names = PyList_New(0);
            if (names == NULL)
                return -1;
            while (l < list.n) {
                span name;
                if (!vector(list, &l, 1, &name) || name.n == 0) {
                    Py_DECREF(names);
                    return 0;
                }
                PyObject *text = PyUnicode_DecodeASCII((const char *)name.p, (Py_ssize_t)name.n, "replace");
                if (text == NULL || PyList_Append(names, text) < 0) {
                    Py_XDECREF(text);
                    Py_DECREF(names);
                    return -1;
                }
                Py_DECREF(text);
            }
            if (PyList_GET_SIZE(names) == 0) {
                Py_DECREF(names);
                return 0;
            }
            Py_SETREF(*alpn, PyList_AsTuple(names));
            Py_DECREF(names);
            if (*alpn == NULL)
                return -1;
        } else if (type == 57 && !max_idle_timeout(body, max_idle)) { /* quic_transport_parameters */
            return 0;
        }
    }
    return 1;
}

PyDoc_STRVAR(sniff_initial_doc,
             "sniff_initial(payload, max_crypto, max_hello) -> (server_name, alpn, max_idle_timeout_ms) | None\n\n"
             "The ClientHello facts of an opened first Initial payload when its CRYPTO frames, in order from\n"
             "offset 0 and within ``max_crypto``, hold a whole, well-formed ClientHello of at most\n"
             "``max_hello`` bytes; None for anything else (the caller then takes the reference path).");

/* The ClientHello facts of a first Initial payload read the usual way: 1 with *server_name, *alpn and *max_idle
 * (new references), 0 for "not simple" (the reference path reads it), -1 with a Python error set. */
static int
payload_facts(span payload, uint64_t max_crypto, uint64_t max_hello, PyObject **server_name, PyObject **alpn,
              uint64_t *max_idle)
{
    span pieces[MAX_CRYPTO_PIECES], hello;
    int count, found = 0;
    uint64_t have;
    unsigned char *joined = NULL;
    *server_name = *alpn = NULL;
    if (!initial_crypto(payload, max_crypto, pieces, &count, &have) || have < 4)
        return 0;
    if (count == 1) {
        hello = pieces[0];
    } else { /* several frames: one copy of the stream (at most max_crypto bytes) */
        joined = PyMem_Malloc((size_t)have);
        if (joined == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        size_t at = 0;
        for (int i = 0; i < count; i++) {
            memcpy(joined + at, pieces[i].p, pieces[i].n);
            at += pieces[i].n;
        }
        hello = (span){ joined, (size_t)have };
    }
    size_t total = 4 + (((size_t)hello.p[1] << 16) | ((size_t)hello.p[2] << 8) | hello.p[3]);
    if (hello.p[0] == 1 && total <= max_hello && total <= hello.n) {
        hello.n = total;
        found = client_hello(hello, server_name, alpn, max_idle);
    }
    PyMem_Free(joined);
    if (found <= 0) {
        Py_CLEAR(*server_name);
        Py_CLEAR(*alpn);
    }
    return found;
}

static PyObject *
sniff_initial(PyObject *self, PyObject *args)
{
    Py_buffer payload;
    long long max_crypto_arg, max_hello_arg;
    uint64_t max_crypto, max_hello;
    if (!PyArg_ParseTuple(args, "y*LL:sniff_initial", &payload, &max_crypto_arg, &max_hello_arg))
        return NULL;
    if (!limit(max_crypto_arg, &max_crypto) || !limit(max_hello_arg, &max_hello)) {
        PyBuffer_Release(&payload);
        return NULL;
    }
    PyObject *server_name, *alpn, *result = NULL;
    uint64_t max_idle;
    int found = payload_facts((span){ payload.buf, (size_t)payload.len }, max_crypto, max_hello, &server_name, &alpn,
                              &max_idle);
    PyBuffer_Release(&payload);
    if (found > 0)
        result = Py_BuildValue("(NNK)", server_name, alpn, (unsigned long long)max_idle);
    else if (found == 0)
        result = Py_NewRef(Py_None);
    return result;
}

PyDoc_STRVAR(sniff_first_doc,
             "sniff_first(datagram, salt, secret_info, key_info, iv_info, hp_info, dcid, pn_offset, end, max_crypto, "
             "max_hello)\n"
             "    -> (packet_number, facts, opened) | None\n\n"
             "A flow's first Initial, at the start of ``datagram``, in one call: its client keys (the key schedule's\n"
             "inputs as ``initial_keys`` takes them), its opening, then what ``sniff_initial`` reads of its payload.\n"
             "``facts`` is (server_name, alpn, max_idle_timeout_ms) and ``opened`` None when the payload held the\n"
             "whole ClientHello the usual way; else ``facts`` is None and ``opened`` (key, iv, hp, payload) for the\n"
             "reference walk and the flow's next datagrams. None if the packet does not authenticate;\n"
             "QuicPacketError for positions the caller should not have passed.");

static PyObject *
sniff_first(PyObject *self, PyObject *args)
{
    Py_buffer datagram, salt, secret_info, key_info, iv_info, hp_info, dcid;
    Py_ssize_t pn_offset, end;
    long long max_crypto_arg, max_hello_arg;
    uint64_t max_crypto, max_hello;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*nnLL:sniff_first", &datagram, &salt, &secret_info, &key_info, &iv_info,
                          &hp_info, &dcid, &pn_offset, &end, &max_crypto_arg, &max_hello_arg))
        return NULL;
    PyObject *result = NULL, *payload = NULL, *server_name, *alpn;
    unsigned char key[SHA256_BYTES], iv[SHA256_BYTES], hp[SHA256_BYTES];
    int64_t packet_number = 0;
    if (!positions_fit(datagram.len, 0, pn_offset, end)) {
        refuse("Initial positions out of the datagram");
        goto done;
    }
    if (salt.len > HMAC_KEY_BYTES) {
        refuse("an Initial salt is at most 64 bytes");
        goto done;
    }
    if (!limit(max_crypto_arg, &max_crypto) || !limit(max_hello_arg, &max_hello))
        goto done;
    if (!derive_keys(&salt, dcid.buf, (size_t)dcid.len, &secret_info, &key_info, &iv_info, &hp_info, key, iv, hp)) {
        crypto_failure("initial_keys");
        goto done;
    }
    int opened = open_packet(datagram.buf, 0, pn_offset, end, -1, key, iv, hp, &packet_number, &payload);
    if (opened <= 0) {
        result = opened == 0 ? Py_NewRef(Py_None) : NULL;
        goto done;
    }
    span plain = { (const unsigned char *)PyBytes_AS_STRING(payload), (size_t)PyBytes_GET_SIZE(payload) };
    uint64_t max_idle;
    int found = payload_facts(plain, max_crypto, max_hello, &server_name, &alpn, &max_idle);
    if (found > 0)
        result = Py_BuildValue("(L(NNK)O)", (long long)packet_number, server_name, alpn, (unsigned long long)max_idle,
                               Py_None);
    else if (found == 0)
        result = Py_BuildValue("(LO(y#y#y#O))", (long long)packet_number, Py_None, key, (Py_ssize_t)KEY_BYTES, iv,
                               (Py_ssize_t)IV_BYTES, hp, (Py_ssize_t)HP_BYTES, payload);
    Py_DECREF(payload);
done:
    PyBuffer_Release(&datagram);
    PyBuffer_Release(&salt);
    PyBuffer_Release(&secret_info);
    PyBuffer_Release(&key_info);
    PyBuffer_Release(&iv_info);
    PyBuffer_Release(&hp_info);
    PyBuffer_Release(&dcid);
    return result;
}

PyDoc_STRVAR(client_hello_facts_doc,
             "client_hello_facts(handshake, max_hello) -> (server_name, alpn, max_idle_timeout_ms) | None\n\n"
             "The facts of one whole, well-formed ClientHello handshake message of at most ``max_hello``\n"
             "bytes (TLS over TCP's peek); None for anything else: wire.client_hello then walks it itself.");

static PyObject *
client_hello_facts(PyObject *self, PyObject *args)
{
    Py_buffer handshake;
    long long max_hello_arg;
    uint64_t max_hello;
    if (!PyArg_ParseTuple(args, "y*L:client_hello_facts", &handshake, &max_hello_arg))
        return NULL;
    PyObject *result = NULL, *server_name = NULL, *alpn = NULL;
    span hello = { handshake.buf, (size_t)handshake.len };
    if (!limit(max_hello_arg, &max_hello))
        goto done;
    if (hello.n < 4 || hello.p[0] != 1 ||
        4 + (((size_t)hello.p[1] << 16) | ((size_t)hello.p[2] << 8) | hello.p[3]) != hello.n || hello.n > max_hello) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    uint64_t max_idle;
    int found = client_hello(hello, &server_name, &alpn, &max_idle);
    if (found >= 0)
        result = found ? Py_BuildValue("(OOK)", server_name, alpn, (unsigned long long)max_idle) : Py_NewRef(Py_None);
done:
    Py_XDECREF(server_name);
    Py_XDECREF(alpn);
    PyBuffer_Release(&handshake);
    return result;
}

PyDoc_STRVAR(
    long_header_doc,
    "long_header(datagram, offset) -> (version, type_bits, dcid, scid, token, header_length, packet_length) | None\n\n"
    "The cleartext fields of the v1/v2 long-header packet at ``offset`` (RFC 9000 section 17.2, RFC 9369),\n"
    "other than Retry: ``type_bits`` are the first byte's bits 4-5; ``header_length`` is where the packet\n"
    "number starts and ``packet_length`` the packet's size, both as quic.packet.parse_long_header gives\n"
    "them. None for anything else (another version, Retry, a malformed or truncated header): the\n"
    "Python parse then reads it and names what is wrong.");

static PyObject *
long_header(PyObject *self, PyObject *args)
{
    Py_buffer buffer;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "y*n:long_header", &buffer, &offset))
        return NULL;
    PyObject *result = Py_None;
    span d = { buffer.buf, (size_t)buffer.len };
    if (offset < 0 || (size_t)offset + 7 > d.n || !(d.p[offset] & 0x80))
        goto done;
    size_t pos = (size_t)offset + 1;
    uint32_t version =
        ((uint32_t)d.p[pos] << 24) | ((uint32_t)d.p[pos + 1] << 16) | ((uint32_t)d.p[pos + 2] << 8) | d.p[pos + 3];
    unsigned type_bits = (d.p[offset] >> 4) & 3;
    if ((version != QUIC_V1 && version != QUIC_V2) || type_bits == (version == QUIC_V1 ? 3u : 0u))
        goto done;
    pos += 4;
    span dcid, scid, token = { d.p, 0 };
    if (!vector(d, &pos, 1, &dcid) || dcid.n > MAX_CID_BYTES || !vector(d, &pos, 1, &scid) || scid.n > MAX_CID_BYTES)
        goto done;
    uint64_t token_length, length;
    if (type_bits == (version == QUIC_V1 ? 0u : 1u)) { /* Initial: a token before the Length */
        if (!varint(d, &pos, &token_length) || token_length > d.n - pos)
            goto done;
        token.p = d.p + pos;
        token.n = (size_t)token_length;
        pos += token.n;
    }
    if (!varint(d, &pos, &length) || length > d.n - pos)
        goto done;
    result = Py_BuildValue("(kIy#y#y#nn)", (unsigned long)version, type_bits, (const char *)dcid.p, (Py_ssize_t)dcid.n,
                           (const char *)scid.p, (Py_ssize_t)scid.n, (const char *)token.p, (Py_ssize_t)token.n,
                           (Py_ssize_t)pos, (Py_ssize_t)(pos + length - (size_t)offset));
    PyBuffer_Release(&buffer);
    return result;
done:
    PyBuffer_Release(&buffer);
    return Py_NewRef(result);
}

static PyMethodDef methods[] = {
    { "initial_keys", initial_keys, METH_VARARGS, initial_keys_doc },
    { "open_initial", open_initial, METH_VARARGS, open_initial_doc },
    { "sniff_initial", sniff_initial, METH_VARARGS, sniff_initial_doc },
    { "sniff_first", sniff_first, METH_VARARGS, sniff_first_doc },
    { "client_hello_facts", client_hello_facts, METH_VARARGS, client_hello_facts_doc },
    { "long_header", long_header, METH_VARARGS, long_header_doc },
    { NULL, NULL, 0, NULL },
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "quic._initial_protection",
    "A client Initial's keys and its opening over libcrypto (quic/_initial_protection.c).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__initial_protection(void)
{
    if (digest == NULL && !setup_contexts()) {
        ERR_clear_error();
        PyErr_SetString(PyExc_ImportError, "libcrypto has no SHA-256, AES-128-ECB or AES-128-GCM here");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *attributes = PyTuple_New(ATTRIBUTE_COUNT);
    for (Py_ssize_t i = 0; attributes != NULL && i < ATTRIBUTE_COUNT; i++) {
        PyObject *pair = Py_BuildValue("(ss)", attribute_table[i][0], attribute_table[i][1]);
        if (pair == NULL)
            Py_CLEAR(attributes);
        else
            PyTuple_SET_ITEM(attributes, i, pair);
    }
    if (attributes == NULL || PyModule_AddObjectRef(m, "ATTRIBUTES", attributes) < 0) {
        Py_XDECREF(attributes);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(attributes);
    return m;
}
