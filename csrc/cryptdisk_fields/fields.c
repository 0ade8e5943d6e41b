/* cryptdisk.fields._cfields: the per-value loops of column encryption over Arrow buffers.
 *
 * cryptdisk.fields hands over an Arrow binary or string column's buffers (validity,
 * int32 or int64 offsets, data) and gets new offsets and data back: one call per batch,
 * the loops without the GIL, so DuckDB's threads encrypt in parallel. No primitive is implemented:
 * AES-GCM and AES-SIV (RFC 5297) come from libgcrypt when the build found it
 * (CD_LIBGCRYPT, see setup.py), else from OpenSSL 3's EVP ("AES-256-SIV"). libgcrypt is
 * preferred: its SIV handle is keyed once and reset per value (about 9M values/s on
 * 16 bytes), where OpenSSL 3.0's SIV context must be re-keyed or copied from a keyed one
 * for every message (0.13M and 0.45M/s); its GCM is also faster on short values.
 * AES-GCM comes from intel-ipsec-mb instead when the build found it (CD_IPSEC_MB): one
 * call per value, about a third of libgcrypt's time on short values (csrc/tools/gcm_short.c).
 * Base64 (RFC 4648, padded) is done here too, to keep SQL's text ciphertexts off Python, and
 * so are the masks and the keyed hash (HMAC-SHA-256 from the same library) of mask_hash.
 *
 * Layouts (docs/fields.md): GCM  header(5) | nonce(12) | ciphertext | tag(16)
 *                           SIV  header(5) | SIV(16)   | ciphertext
 * The offsets are checked against their buffers; a value that fails (base64, layout,
 * authentication) is reported by row, and no unauthenticated plaintext is returned. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#ifdef CD_LIBGCRYPT
#include <gcrypt.h>
#else
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#endif
#ifdef CD_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

#define HEADER 5
#define NONCE 12
#define TAG 16

typedef struct {
    Py_buffer b;
    int held;
} Buf;

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].b);
}

/* -- the ciphers ------------------------------------------------------------------------ */

#ifdef CD_LIBGCRYPT

typedef gcry_cipher_hd_t Base;

static int base_open(Base *h, int siv, const unsigned char *key, size_t keylen, int enc) {
    (void)enc;
    int algo = (siv ? keylen / 2 : keylen) == 32 ? GCRY_CIPHER_AES256 : GCRY_CIPHER_AES128;
    if (gcry_cipher_open(h, algo, siv ? GCRY_CIPHER_MODE_SIV : GCRY_CIPHER_MODE_GCM, 0) != 0) {
        *h = NULL;
        return 0;
    }
    return gcry_cipher_setkey(*h, key, keylen) == 0;
}

static void base_close(Base h) { gcry_cipher_close(h); /* wipes the key schedule */ }

#ifndef CD_IPSEC_MB
static int gcm_seal(Base h, const unsigned char *nonce, const unsigned char *in, size_t n, unsigned char *ct,
                    unsigned char *tag) {
    return gcry_cipher_setiv(h, nonce, NONCE) == 0 && gcry_cipher_final(h) == 0 &&
           gcry_cipher_encrypt(h, ct, n, in, n) == 0 && gcry_cipher_gettag(h, tag, TAG) == 0;
}

/* 1 authentic, 0 not, -1 library failure */
static int gcm_open(Base h, const unsigned char *nonce, const unsigned char *ct, size_t n, const unsigned char *tag,
                    unsigned char *out) {
    if (gcry_cipher_setiv(h, nonce, NONCE) != 0 || gcry_cipher_final(h) != 0 ||
        gcry_cipher_decrypt(h, out, n, ct, n) != 0)
        return -1;
    return gcry_cipher_checktag(h, tag, TAG) == 0;
}
#endif

static int siv_seal(Base h, Base unused, const unsigned char *in, size_t n, unsigned char *siv, unsigned char *ct) {
    (void)unused;
    return gcry_cipher_reset(h) == 0 && gcry_cipher_final(h) == 0 && gcry_cipher_encrypt(h, ct, n, in, n) == 0 &&
           gcry_cipher_gettag(h, siv, TAG) == 0;
}

static int siv_open(Base h, Base unused, const unsigned char *siv, const unsigned char *ct, size_t n,
                    unsigned char *out) {
    (void)unused;
    if (gcry_cipher_reset(h) != 0 || gcry_cipher_set_decryption_tag(h, siv, TAG) != 0 ||
        gcry_cipher_final(h) != 0)
        return -1;
    return gcry_cipher_decrypt(h, out, n, ct, n) == 0;
}

static const char *base_library(char *buf, size_t n) {
    snprintf(buf, n, "libgcrypt %s", gcry_check_version(NULL));
    return buf;
}

#else /* OpenSSL EVP */

typedef EVP_CIPHER_CTX *Base;

static int base_open(Base *h, int siv, const unsigned char *key, size_t keylen, int enc) {
    const char *name = siv ? (keylen == 64 ? "AES-256-SIV" : "AES-128-SIV")
                           : (keylen == 32 ? "AES-256-GCM" : "AES-128-GCM");
    EVP_CIPHER *cipher = EVP_CIPHER_fetch(NULL, name, NULL);
    *h = EVP_CIPHER_CTX_new();
    int ok = cipher != NULL && *h != NULL && EVP_CipherInit_ex2(*h, cipher, key, NULL, enc, NULL) == 1;
    EVP_CIPHER_free(cipher);
    return ok;
}

static void base_close(Base h) { EVP_CIPHER_CTX_free(h); /* cleanses the key schedule */ }

#ifndef CD_IPSEC_MB
static int gcm_seal(Base h, const unsigned char *nonce, const unsigned char *in, size_t n, unsigned char *ct,
                    unsigned char *tag) {
    int len = 0;
    if (n > INT_MAX) /* EVP takes int lengths */
        return 0;
    return EVP_EncryptInit_ex2(h, NULL, NULL, nonce, NULL) == 1 &&
           (n == 0 || EVP_EncryptUpdate(h, ct, &len, in, (int)n) == 1) &&
           EVP_EncryptFinal_ex(h, ct + n, &len) == 1 &&
           EVP_CIPHER_CTX_ctrl(h, EVP_CTRL_AEAD_GET_TAG, TAG, tag) == 1;
}

static int gcm_open(Base h, const unsigned char *nonce, const unsigned char *ct, size_t n, const unsigned char *tag,
                    unsigned char *out) {
    int len = 0;
    if (n > INT_MAX) /* EVP takes int lengths */
        return -1;
    if (EVP_DecryptInit_ex2(h, NULL, NULL, nonce, NULL) != 1 ||
        (n && EVP_DecryptUpdate(h, out, &len, ct, (int)n) != 1) ||
        EVP_CIPHER_CTX_ctrl(h, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)tag) != 1)
        return -1;
    return EVP_DecryptFinal_ex(h, out + n, &len) == 1;
}
#endif

/* OpenSSL 3.0's SIV context serves one message: each value works on a copy of the keyed one.
 * Its EVP_EncryptUpdate ignores empty input, so an empty value cannot be sealed or opened
 * (RFC 5297 allows it): -2 sends the batch to cryptography's path. */
static int siv_seal(Base keyed, Base work, const unsigned char *in, size_t n, unsigned char *siv, unsigned char *ct) {
    int len = 0;
    if (n == 0)
        return -2;
    if (n > INT_MAX)
        return 0;
    return EVP_CIPHER_CTX_copy(work, keyed) == 1 && EVP_EncryptUpdate(work, ct, &len, in, (int)n) == 1 &&
           EVP_EncryptFinal_ex(work, ct + n, &len) == 1 &&
           EVP_CIPHER_CTX_ctrl(work, EVP_CTRL_AEAD_GET_TAG, TAG, siv) == 1;
}

static int siv_open(Base keyed, Base work, const unsigned char *siv, const unsigned char *ct, size_t n,
                    unsigned char *out) {
    int len = 0;
    if (n == 0)
        return -2;
    if (n > INT_MAX)
        return -1;
    if (EVP_CIPHER_CTX_copy(work, keyed) != 1 ||
        EVP_CIPHER_CTX_ctrl(work, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)siv) != 1)
        return -1;
    return EVP_DecryptUpdate(work, out, &len, ct, (int)n) == 1 && EVP_DecryptFinal_ex(work, out + n, &len) == 1;
}

static const char *base_library(char *buf, size_t n) {
    snprintf(buf, n, "%s", OpenSSL_version(OPENSSL_VERSION));
    return buf;
}

#endif

#ifdef CD_IPSEC_MB

/* AES-GCM from Intel's multi-buffer library (intel-ipsec-mb; CD_IPSEC_MB, see setup.py):
 * one call per value (IMB_AES256_GCM_DEC) on a key's precomputed data (the AES key schedule
 * and the GHASH key's powers), on the code path init_mb_mgr_auto picks for this CPU
 * (VAES and AVX-512, AVX2, AVX or SSE), where libgcrypt takes four calls a value. The
 * library returns the tag it computes; it is compared with the value's in constant time
 * (CRYPTO_memcmp), and a value that fails is never handed out: open_column wipes its whole
 * output. AES-SIV and HMAC stay with the base library. The manager is made at import and
 * only its function table is read afterwards (the GCM calls keep no state in it). */

static IMB_MGR *imb;
static IMB_ARCH imb_arch;

/* a GCM handle: one batch's key data and the working context, wiped on close */
typedef struct {
    struct gcm_key_data kd;
    struct gcm_context_data ctx;
    int aes256;
} Gcm;

typedef void *Ctx; /* a Gcm (GCM) or a Base (SIV) */

static int ctx_open(Ctx *h, int siv, const unsigned char *key, size_t keylen, int enc) {
    if (siv) {
        Base b = NULL;
        int ok = base_open(&b, siv, key, keylen, enc);
        *h = b;
        return ok;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(Gcm)) != 0) {
        *h = NULL;
        return 0;
    }
    Gcm *g = p;
    memset(g, 0, sizeof *g);
    g->aes256 = keylen == 32;
    if (g->aes256)
        IMB_AES256_GCM_PRE(imb, key, &g->kd);
    else
        IMB_AES128_GCM_PRE(imb, key, &g->kd);
    *h = g;
    return 1;
}

static void ctx_close(Ctx h, int siv) {
    if (siv) {
        base_close(h);
        return;
    }
    OPENSSL_cleanse(h, sizeof(Gcm)); /* the key schedule, the GHASH key, the last value's state */
    free(h);
}

static int gcm_seal(Ctx h, const unsigned char *nonce, const unsigned char *in, size_t n, unsigned char *ct,
                    unsigned char *tag) {
    Gcm *g = h;
    if (g->aes256)
        IMB_AES256_GCM_ENC(imb, &g->kd, &g->ctx, ct, in, n, nonce, NULL, 0, tag, TAG);
    else
        IMB_AES128_GCM_ENC(imb, &g->kd, &g->ctx, ct, in, n, nonce, NULL, 0, tag, TAG);
    return 1;
}

/* 1 authentic, 0 not (out holds what must not be released: the caller wipes it). The
 * tag comparison is constant time: the two halves' differences ORed, one test at the end
 * (what CRYPTO_memcmp does, without a call and a byte loop per value). */
static int gcm_open(Ctx h, const unsigned char *nonce, const unsigned char *ct, size_t n, const unsigned char *tag,
                    unsigned char *out) {
    Gcm *g = h;
    uint64_t want[2], got[2];
    memcpy(want, tag, TAG);
    got[0] = ~want[0], got[1] = ~want[1]; /* a call that returned no tag cannot match */
    if (g->aes256)
        IMB_AES256_GCM_DEC(imb, &g->kd, &g->ctx, out, ct, n, nonce, NULL, 0, (unsigned char *)got, TAG);
    else
        IMB_AES128_GCM_DEC(imb, &g->kd, &g->ctx, out, ct, n, nonce, NULL, 0, (unsigned char *)got, TAG);
    volatile uint64_t diff = (got[0] ^ want[0]) | (got[1] ^ want[1]);
    return diff == 0;
}

static const char *library(char *buf, size_t n) {
    char base[80];
    static const char *ARCH[] = {"none", "no AES-NI", "SSE", "AVX", "AVX2", "AVX-512"};
    snprintf(buf, n, "%s, AES-GCM from intel-ipsec-mb %s (%s)", base_library(base, sizeof base),
             imb_get_version_str(), imb_arch < IMB_ARCH_NUM ? ARCH[imb_arch] : "?");
    return buf;
}

static int gcm_library_init(void) {
    if (imb_get_version() < IMB_VERSION_NUM) {
        PyErr_SetString(PyExc_ImportError, "intel-ipsec-mb is older than the headers cryptdisk was built with");
        return 0;
    }
    if (imb == NULL) {
        imb = alloc_mb_mgr(0);
        if (imb == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        init_mb_mgr_auto(imb, &imb_arch);
        if (imb_get_errno(imb) != 0 || imb_arch == IMB_ARCH_NONE || imb_arch == IMB_ARCH_NOAESNI) {
            /* without AES-NI its GCM is a table implementation: keep the base library's */
            free_mb_mgr(imb);
            imb = NULL;
            PyErr_SetString(PyExc_ImportError, "intel-ipsec-mb found no AES-NI on this CPU");
            return 0;
        }
    }
    return 1;
}

#else

typedef Base Ctx;
#define ctx_open base_open
#define ctx_close(h, siv) base_close(h)
#define library base_library
static int gcm_library_init(void) { return 1; }

#endif

static int key_ok(Py_ssize_t keylen, int siv) {
    if (siv ? (keylen == 32 || keylen == 64) : (keylen == 16 || keylen == 32))
        return 1;
    PyErr_SetString(PyExc_ValueError, "wrong key length");
    return 0;
}

/* -- base64 (RFC 4648, with padding) ---------------------------------------------------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_one(const unsigned char *in, size_t n, unsigned char *out) {
    size_t i = 0;
    for (; i + 3 <= n; i += 3, out += 4) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = B64[v >> 18];
        out[1] = B64[(v >> 12) & 63];
        out[2] = B64[(v >> 6) & 63];
        out[3] = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[0] = B64[v >> 18];
        out[1] = B64[(v >> 12) & 63];
        out[2] = out[3] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[0] = B64[v >> 18];
        out[1] = B64[(v >> 12) & 63];
        out[2] = B64[(v >> 6) & 63];
        out[3] = '=';
    }
}

static signed char DEC[256];
/* DQ[k][c]: character c's 6 bits at position k of a quantum, shifted into place in its 24
 * bits; BAD (bit 24) for a character outside the alphabet, so one OR of four lookups
 * decodes a quantum and one test checks it. */
#define BAD 0x01000000u
static uint32_t DQ[4][256];

/* Full quanta (no padding) 16 or 32 characters at a time with SSSE3 / AVX2, as in
 * aklomp/base64's decoder (W. Mula and D. Lemire, "Faster Base64 Encoding and Decoding
 * using AVX2 Instructions", 2018): two nibble lookups flag a character outside the
 * alphabet, a third gives the offset from character to value, two multiply-adds and a
 * shuffle pack four 6-bit values into three bytes. Each step writes 16 (32) bytes of
 * which 12 (24) are decoded, so up to 7 bytes past a value's decoded ones: its buffer
 * has SLACK bytes of room. The last quantum (padding) is decoded by the scalar code.
 * Chosen at import by the CPU (simd_level); base64_simd() lowers it (tests). */
#define SLACK 32
static int simd_level; /* 0 scalar, 1 SSSE3, 2 AVX2 */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CD_SIMD 1
#include <immintrin.h>

#define B64_LUT_LO 0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1A, 0x1B, 0x1B, 0x1B, 0x1A
#define B64_LUT_HI 0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10
#define B64_ROLL 0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0
#define B64_PACK 2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1

/* Decodes 16-character blocks while `*i + 16 <= n`; 0 at a character outside the alphabet. */
__attribute__((target("ssse3"))) static inline int quanta16(const unsigned char *in, size_t n, size_t *i,
                                                            unsigned char **out) {
    const __m128i lut_lo = _mm_setr_epi8(B64_LUT_LO), lut_hi = _mm_setr_epi8(B64_LUT_HI);
    const __m128i roll = _mm_setr_epi8(B64_ROLL), pack = _mm_setr_epi8(B64_PACK), m2f = _mm_set1_epi8(0x2F);
    for (; *i + 16 <= n; *i += 16, *out += 12) {
        __m128i s = _mm_loadu_si128((const __m128i *)(in + *i));
        __m128i hn = _mm_and_si128(_mm_srli_epi32(s, 4), m2f);
        __m128i bad = _mm_and_si128(_mm_shuffle_epi8(lut_lo, _mm_and_si128(s, m2f)), _mm_shuffle_epi8(lut_hi, hn));
        if (_mm_movemask_epi8(_mm_cmpgt_epi8(bad, _mm_setzero_si128())))
            return 0;
        s = _mm_add_epi8(s, _mm_shuffle_epi8(roll, _mm_add_epi8(_mm_cmpeq_epi8(s, m2f), hn)));
        s = _mm_madd_epi16(_mm_maddubs_epi16(s, _mm_set1_epi32(0x01400140)), _mm_set1_epi32(0x00011000));
        _mm_storeu_si128((__m128i *)*out, _mm_shuffle_epi8(s, pack));
    }
    return 1;
}

__attribute__((target("ssse3"))) static int quanta_ssse3(const unsigned char *in, size_t n, size_t *i,
                                                         unsigned char **out) {
    return quanta16(in, n, i, out);
}

__attribute__((target("avx2"))) static int quanta_avx2(const unsigned char *in, size_t n, size_t *i,
                                                       unsigned char **out) {
    const __m256i lut_lo = _mm256_setr_epi8(B64_LUT_LO, B64_LUT_LO), lut_hi = _mm256_setr_epi8(B64_LUT_HI, B64_LUT_HI);
    const __m256i roll = _mm256_setr_epi8(B64_ROLL, B64_ROLL), pack = _mm256_setr_epi8(B64_PACK, B64_PACK);
    const __m256i m2f = _mm256_set1_epi8(0x2F), join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
    for (; *i + 32 <= n; *i += 32, *out += 24) {
        __m256i s = _mm256_loadu_si256((const __m256i *)(in + *i));
        __m256i hn = _mm256_and_si256(_mm256_srli_epi32(s, 4), m2f);
        if (!_mm256_testz_si256(_mm256_shuffle_epi8(lut_lo, _mm256_and_si256(s, m2f)),
                                _mm256_shuffle_epi8(lut_hi, hn)))
            return 0;
        s = _mm256_add_epi8(s, _mm256_shuffle_epi8(roll, _mm256_add_epi8(_mm256_cmpeq_epi8(s, m2f), hn)));
        s = _mm256_madd_epi16(_mm256_maddubs_epi16(s, _mm256_set1_epi32(0x01400140)), _mm256_set1_epi32(0x00011000));
        _mm256_storeu_si256((__m256i *)*out, _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(s, pack), join));
    }
    return quanta16(in, n, i, out);
}

static int simd_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("ssse3") ? 1 : 0;
}
#else
static int simd_available(void) { return 0; }
#endif

/* 1 if `in` (n bytes, n % 4 == 0) is padded base64 decoding to exactly out_n bytes;
 * out has room for out_n + SLACK bytes. */
static int unb64_one(const unsigned char *in, size_t n, unsigned char *out, size_t out_n) {
    if (n % 4 || out_n != n / 4 * 3 - (n && in[n - 1] == '=') - (n && in[n - 2] == '='))
        return 0;
    if (n == 0)
        return 1;
    size_t i = 0, full = n - 4; /* every quantum but the last has no padding */
    unsigned char *w = out;
#ifdef CD_SIMD
    if (simd_level == 2 && !quanta_avx2(in, full, &i, &w))
        return 0;
    if (simd_level == 1 && !quanta_ssse3(in, full, &i, &w))
        return 0;
#endif
    size_t o = (size_t)(w - out);
    for (; i < full; i += 4) {
        uint32_t v = DQ[0][in[i]] | DQ[1][in[i + 1]] | DQ[2][in[i + 2]] | DQ[3][in[i + 3]];
        if (v & BAD)
            return 0;
        out[o] = (unsigned char)(v >> 16);
        out[o + 1] = (unsigned char)(v >> 8);
        out[o + 2] = (unsigned char)v;
        o += 3;
    }
    const unsigned char *t = in + full;
    int a = DEC[t[0]], b = DEC[t[1]], c = DEC[t[2]], d = DEC[t[3]];
    if (a < 0 || b < 0)
        return 0;
    if (t[2] == '=' && t[3] == '=') {
        out[o++] = (unsigned char)(a << 2 | b >> 4);
        return o == out_n;
    }
    if (c < 0)
        return 0;
    if (t[3] == '=') {
        out[o++] = (unsigned char)(a << 2 | b >> 4);
        out[o++] = (unsigned char)((b & 15) << 4 | c >> 2);
        return o == out_n;
    }
    if (d < 0)
        return 0;
    out[o++] = (unsigned char)(a << 2 | b >> 4);
    out[o++] = (unsigned char)((b & 15) << 4 | c >> 2);
    out[o++] = (unsigned char)((c & 3) << 6 | d);
    return o == out_n;
}

/* 1 if v (n bytes) is valid UTF-8 (RFC 3629: shortest forms, no surrogates, at most
 * U+10FFFF), as Arrow's string type requires; ASCII runs go 8 bytes at a time. */
static int utf8_ok(const unsigned char *v, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, v + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = v[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (i + len > n || v[i + 1] < lo || v[i + 1] > hi)
            return 0;
        for (int k = 2; k < len; k++)
            if ((v[i + k] & 0xC0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

/* -- whole Arrow columns (the SQL functions' path: one call per batch) ------------------ */

/* An Arrow binary/string column's buffers as given by Python. */
typedef struct {
    Buf bufs[3]; /* validity (may be empty), offsets, data */
    const unsigned char *validity, *data;
    const void *offsets;
    int wide; /* int64 offsets */
    Py_ssize_t count, offset;
} Column;

static int64_t col_off(const Column *c, Py_ssize_t i) {
    i += c->offset;
    return c->wide ? ((const int64_t *)c->offsets)[i] : (int64_t)((const int32_t *)c->offsets)[i];
}

static int col_valid(const Column *c, Py_ssize_t i) {
    i += c->offset;
    return c->validity == NULL || (c->validity[i >> 3] >> (i & 7)) & 1;
}

static int col_check(Column *c) {
    Py_ssize_t need = (c->count + c->offset + 1) * (c->wide ? 8 : 4);
    if (c->count < 0 || c->offset < 0 || c->bufs[1].b.len < need ||
        (c->validity && c->bufs[0].b.len * 8 < c->count + c->offset)) {
        PyErr_SetString(PyExc_ValueError, "column buffers too short");
        return 0;
    }
    if (c->count == 0)
        return 1;
    int64_t first = col_off(c, 0), prev = first;
    for (Py_ssize_t i = 1; i <= c->count; i++) {
        int64_t o = col_off(c, i);
        if (o < prev) {
            PyErr_SetString(PyExc_ValueError, "column offsets decrease");
            return 0;
        }
        prev = o;
    }
    if (first < 0 || prev > c->bufs[2].b.len) {
        PyErr_SetString(PyExc_ValueError, "column offsets out of range");
        return 0;
    }
    return 1;
}

/* New bytes of n bytes (uninitialised), or NULL with MemoryError. */
static PyObject *new_bytes(Py_ssize_t n) { return PyBytes_FromStringAndSize(NULL, n < 0 ? 0 : n); }

/* A writable buffer of at least n bytes from alloc(n) (pyarrow.allocate_buffer: Arrow's
 * pool keeps freed memory mapped, where malloc would map and fault in fresh pages for
 * every large batch); its object, or NULL with an exception. */
static PyObject *new_buffer(PyObject *alloc, Py_ssize_t n, Py_buffer *view) {
    PyObject *obj = PyObject_CallFunction(alloc, "n", n);
    if (!obj)
        return NULL;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) != 0) {
        Py_DECREF(obj);
        return NULL;
    }
    if (view->len < n) {
        PyBuffer_Release(view);
        Py_DECREF(obj);
        PyErr_SetString(PyExc_ValueError, "alloc returned a short buffer");
        return NULL;
    }
    return obj;
}

#define B64LEN(n) (((n) + 2) / 3 * 4)

/* seal_column(siv, key, header, validity, offsets, data, wide, count, offset, b64, alloc)
 *   -> (wide_out, offsets_bytes, data_bytes), or None if this build cannot (see siv_seal)
 * Every valid value sealed (GCM with a fresh RAND_bytes nonce, or SIV) with the 5-byte
 * header, as binary or as padded base64; null rows get empty values (the caller keeps
 * the validity). Output offsets are int64 if the data reaches 2**31 bytes, else int32. */
static PyObject *py_seal_column(PyObject *self, PyObject *args) {
    int siv, b64, wide;
    Py_buffer key, header;
    Column c;
    memset(&c, 0, sizeof c);
    PyObject *alloc;
    if (!PyArg_ParseTuple(args, "py*y*y*y*y*pnnpO", &siv, &key, &header, &c.bufs[0].b, &c.bufs[1].b, &c.bufs[2].b,
                          &wide, &c.count, &c.offset, &b64, &alloc))
        return NULL;
    c.wide = wide;
    c.validity = c.bufs[0].b.len ? c.bufs[0].b.buf : NULL;
    c.offsets = c.bufs[1].b.buf;
    c.data = c.bufs[2].b.buf;
    for (int i = 0; i < 3; i++)
        c.bufs[i].held = 1;
    PyObject *offs = NULL, *data = NULL, *result = NULL;
    Py_buffer dview = {0};
    unsigned char *nonces = NULL, *scratch = NULL;
    Ctx h = NULL, work = NULL;
    int error = 0, fallback = 0, overhead = siv ? HEADER + TAG : HEADER + NONCE + TAG;
    if (!col_check(&c) || !key_ok(key.len, siv))
        goto out;
    if (header.len != HEADER) {
        PyErr_SetString(PyExc_ValueError, "a 5-byte header expected");
        goto out;
    }
    /* output sizes */
    int64_t total = 0, longest = 0, nvalid = 0;
    for (Py_ssize_t i = 0; i < c.count; i++)
        if (col_valid(&c, i)) {
            int64_t n = col_off(&c, i + 1) - col_off(&c, i) + overhead;
            total += b64 ? B64LEN(n) : n;
            longest = n > longest ? n : longest;
            nvalid++;
        }
    int wide_out = total >= ((int64_t)1 << 31);
    offs = new_bytes((c.count + 1) * (wide_out ? 8 : 4));
    if (!offs || !(data = new_buffer(alloc, (Py_ssize_t)total, &dview)))
        goto out;
    if (!siv && nvalid) {
        nonces = PyMem_RawMalloc((size_t)nvalid * NONCE);
        if (!nonces || RAND_bytes(nonces, (int)(nvalid * NONCE)) != 1) {
            PyErr_SetString(PyExc_RuntimeError, "no random nonces (RAND_bytes failed)");
            goto out;
        }
    }
    if (b64 && longest && !(scratch = PyMem_RawMalloc((size_t)longest))) {
        PyErr_NoMemory();
        goto out;
    }
    unsigned char *dst = dview.buf;
    void *dof = PyBytes_AS_STRING(offs);
    const unsigned char *hdr = header.buf;
    Py_BEGIN_ALLOW_THREADS
    if (!ctx_open(&h, siv, key.buf, (size_t)key.len, 1))
        error = 1;
#ifndef CD_LIBGCRYPT
    if (!error && siv && (work = EVP_CIPHER_CTX_new()) == NULL)
        error = 1;
#endif
    int64_t at = 0, j = 0;
    for (Py_ssize_t i = 0; i < c.count && !error; i++) {
        if (wide_out)
            ((int64_t *)dof)[i] = at;
        else
            ((int32_t *)dof)[i] = (int32_t)at;
        if (!col_valid(&c, i))
            continue;
        int64_t s = col_off(&c, i);
        size_t n = (size_t)(col_off(&c, i + 1) - s);
        unsigned char *o = b64 ? scratch : dst + at;
        memcpy(o, hdr, HEADER);
        if (siv) {
            int r = siv_seal(h, work, c.data + s, n, o + HEADER, o + HEADER + TAG);
            if (r == -2) {
                fallback = 1;
                break;
            }
            error = !r;
        }
        else {
            memcpy(o + HEADER, nonces + NONCE * j++, NONCE);
            error = !gcm_seal(h, o + HEADER, c.data + s, n, o + HEADER + NONCE, o + HEADER + NONCE + n);
        }
        if (b64) {
            b64_one(scratch, n + (size_t)overhead, dst + at);
            at += B64LEN((int64_t)n + overhead);
        } else
            at += (int64_t)n + overhead;
    }
    if (wide_out)
        ((int64_t *)dof)[c.count] = at;
    else
        ((int32_t *)dof)[c.count] = (int32_t)at;
#ifndef CD_LIBGCRYPT
    if (work)
        ctx_close(work, 1);
#endif
    if (h)
        ctx_close(h, siv);
    Py_END_ALLOW_THREADS
    if (error)
        PyErr_SetString(PyExc_RuntimeError, "the cipher library failed (out of memory?)");
    else if (fallback)
        result = Py_NewRef(Py_None);
    else
        result = Py_BuildValue("(iOO)", wide_out, offs, data);
out:
    if (nonces) {
        OPENSSL_cleanse(nonces, (size_t)nvalid * NONCE);
        PyMem_RawFree(nonces);
    }
    if (scratch)
        PyMem_RawFree(scratch);
    if (dview.obj)
        PyBuffer_Release(&dview);
    Py_XDECREF(offs);
    Py_XDECREF(data);
    PyBuffer_Release(&key);
    PyBuffer_Release(&header);
    release(c.bufs, 3);
    return result;
}

#define MAX_VERSIONS 8

/* Valid row i's value checked for its layout: 0 with *v, *n (its bytes: with b64, decoded
 * whole into scratch, which has room for SLACK bytes more than the longest value) and *id
 * (its key id); else the reason (1 not base64, 2 too short, 3 unknown version byte). */
static int value_at(const Column *c, Py_ssize_t i, int b64, int overhead, unsigned char *scratch,
                    const unsigned char **v, int64_t *n, uint32_t *id) {
    int64_t s = col_off(c, i), len = col_off(c, i + 1) - s;
    const unsigned char *p = c->data + s;
    if (b64) {
        if (len % 4)
            return 1;
        int64_t m = len / 4 * 3 - (len && p[len - 1] == '=') - (len && p[len - 2] == '=');
        if (m < overhead)
            return 2;
        if (!unb64_one(p, (size_t)len, scratch, (size_t)m))
            return 1;
        p = scratch;
        len = m;
    } else if (len < overhead)
        return 2;
    if (p[0] != 1)
        return 3;
    *id = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
    *v = p;
    *n = len;
    return 0;
}

/* The rows from `from` on checked for their layout, the key ids met added to ids: the
 * first one's reason (value_at's, or 5: more than MAX_VERSIONS key ids) with *bad its
 * row, or 0. */
static int check_rest(const Column *c, Py_ssize_t from, int b64, int overhead, unsigned char *scratch,
                      uint32_t *ids, int *nids, Py_ssize_t *bad) {
    for (Py_ssize_t i = from; i < c->count; i++) {
        if (!col_valid(c, i))
            continue;
        const unsigned char *v;
        int64_t n;
        uint32_t id;
        int r = value_at(c, i, b64, overhead, scratch, &v, &n, &id);
        if (!r) {
            int k = 0;
            while (k < *nids && ids[k] != id)
                k++;
            if (k == *nids) {
                if (*nids == MAX_VERSIONS)
                    r = 5;
                else
                    ids[(*nids)++] = id;
            }
        }
        if (r) {
            *bad = i;
            return r;
        }
    }
    return 0;
}

/* A key version's subkey from subkey(key_id) (with the GIL), checked; NULL with an exception. */
static PyObject *fetch_subkey(PyObject *subkey, uint32_t id, int siv) {
    PyObject *got = PyObject_CallFunction(subkey, "k", (unsigned long)id);
    if (got && (!PyBytes_Check(got) || !key_ok(PyBytes_GET_SIZE(got), siv))) {
        Py_DECREF(got);
        got = NULL;
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "subkey must return bytes");
    }
    return got;
}

/* open_column(siv, subkey, validity, offsets, data, wide, count, offset, b64, alloc, utf8)
 *   -> (wide_out, offsets_bytes, data_bytes, failed_row, reason)
 * reason: 0 done; 1 not base64; 2 too short; 3 unknown version byte; 4 does not
 * authenticate; 5 more than MAX_VERSIONS key versions in one batch; 6 this build cannot
 * (see siv_seal); 7 a plaintext is not UTF-8 (checked only with utf8, for text output, on
 * the value just written). subkey(key_id) gives a version's subkey (called with the GIL,
 * once per version met); its exceptions propagate. What is reported is what a check of the
 * whole batch's layout first, then of its key versions, then of each value in order would
 * report: a layout reason (1-3, 5) anywhere wins over a key error, which wins over 4 and 7.
 *
 * One pass over the values, without the GIL: each is decoded (base64) into a scratch
 * buffer, checked, and opened straight into the output, whose size is bounded from the
 * offsets alone (a base64 value's padding is only known from its text: the data buffer
 * may be up to two bytes a value longer than the last offset). A key id not met before
 * stops the pass for its subkey (with the GIL), and it goes on from that row. */
static PyObject *py_open_column(PyObject *self, PyObject *args) {
    int siv, b64, wide, utf8 = 0;
    PyObject *subkey;
    Column c;
    memset(&c, 0, sizeof c);
    PyObject *alloc;
    if (!PyArg_ParseTuple(args, "pOy*y*y*pnnpO|p", &siv, &subkey, &c.bufs[0].b, &c.bufs[1].b, &c.bufs[2].b, &wide,
                          &c.count, &c.offset, &b64, &alloc, &utf8))
        return NULL;
    c.wide = wide;
    c.validity = c.bufs[0].b.len ? c.bufs[0].b.buf : NULL;
    c.offsets = c.bufs[1].b.buf;
    c.data = c.bufs[2].b.buf;
    for (int i = 0; i < 3; i++)
        c.bufs[i].held = 1;
    PyObject *offs = NULL, *data = NULL, *result = NULL, *keys[MAX_VERSIONS] = {NULL};
    Py_buffer dview = {0};
    uint32_t ids[MAX_VERSIONS];
    Ctx hs[MAX_VERSIONS] = {NULL};
    Ctx work = NULL;
    int nkeys = 0, nids = 0, error = 0, reason = 0, fallback = 0, not_text = 0, done = 0;
    Py_ssize_t failed = -1, bad = -1;
    unsigned char *scratch = NULL, *dst = NULL; /* scratch: one decoded ciphertext (b64) */
    int64_t longest = 0, bound = 0;
    int overhead = siv ? HEADER + TAG : HEADER + NONCE + TAG;
    if (!col_check(&c))
        goto out;
    /* the output's size bound from the offsets: no value is read yet */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < c.count; i++) {
        if (!col_valid(&c, i))
            continue;
        int64_t n = col_off(&c, i + 1) - col_off(&c, i), m = b64 ? n / 4 * 3 : n;
        if (m > overhead)
            bound += m - overhead;
        longest = m > longest ? m : longest;
    }
    Py_END_ALLOW_THREADS
    int wide_out = bound >= ((int64_t)1 << 31);
    offs = new_bytes((c.count + 1) * (wide_out ? 8 : 4));
    if (!offs || !(data = new_buffer(alloc, (Py_ssize_t)bound, &dview)))
        goto out;
    dst = dview.buf;
    if (b64 && longest && !(scratch = PyMem_RawMalloc((size_t)longest + SLACK))) {
        PyErr_NoMemory();
        goto out;
    }
#ifndef CD_LIBGCRYPT
    if (siv && (work = EVP_CIPHER_CTX_new()) == NULL)
        error = 1;
#endif
    void *dof = PyBytes_AS_STRING(offs);
    int64_t out_at = 0;
    Py_ssize_t i = 0;
    while (!error) {
        int need = 0;
        Py_BEGIN_ALLOW_THREADS
        for (; i < c.count; i++) {
            if (wide_out)
                ((int64_t *)dof)[i] = out_at;
            else
                ((int32_t *)dof)[i] = (int32_t)out_at;
            if (!col_valid(&c, i))
                continue;
            const unsigned char *v;
            int64_t n;
            uint32_t id;
            if ((reason = value_at(&c, i, b64, overhead, scratch, &v, &n, &id)) != 0) {
                bad = i;
                break;
            }
            int k = 0;
            while (k < nkeys && ids[k] != id)
                k++;
            if (k == nkeys) { /* a key version not met yet: its subkey, then row i again */
                if (nkeys == MAX_VERSIONS)
                    reason = 5, bad = i;
                else
                    ids[nids++] = id, need = 1;
                break;
            }
            n -= overhead;
            int r = siv ? siv_open(hs[k], work, v + HEADER, v + HEADER + TAG, (size_t)n, dst + out_at)
                        : gcm_open(hs[k], v + HEADER, v + HEADER + NONCE, (size_t)n, v + HEADER + NONCE + n,
                                   dst + out_at);
            if (r == -2) {
                fallback = 1;
                break;
            }
            if (r < 0) {
                error = 1;
                break;
            }
            if (r == 0 || (utf8 && !utf8_ok(dst + out_at, n))) {
                failed = i, not_text = r != 0;
                break;
            }
            out_at += n;
        }
        /* a value that failed: the rest is checked still (layout, key ids), for the
         * report a whole-batch check would make first */
        if (failed >= 0)
            reason = check_rest(&c, i + 1, b64, overhead, scratch, ids, &nids, &bad);
        Py_END_ALLOW_THREADS
        if (!need)
            break;
        PyObject *got = fetch_subkey(subkey, ids[nkeys], siv);
        if (!got) { /* a layout error further on is reported first: look for one */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            int later;
            Py_BEGIN_ALLOW_THREADS
            later = check_rest(&c, i + 1, b64, overhead, scratch, ids, &nids, &bad);
            Py_END_ALLOW_THREADS
            if (later) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                reason = later;
                break;
            }
            PyErr_Restore(et, ev, tb);
            goto out;
        }
        keys[nkeys] = got;
        if (!ctx_open(&hs[nkeys], siv, (const unsigned char *)PyBytes_AS_STRING(got), (size_t)PyBytes_GET_SIZE(got),
                      0))
            error = 1;
        nkeys++;
    }
    if (!error && !reason && !fallback && failed >= 0) /* the key versions met after it */
        for (; nkeys < nids; nkeys++)
            if (!(keys[nkeys] = fetch_subkey(subkey, ids[nkeys], siv)))
                goto out;
    if (wide_out)
        ((int64_t *)dof)[c.count] = out_at;
    else
        ((int32_t *)dof)[c.count] = (int32_t)out_at;
    if (error)
        PyErr_SetString(PyExc_RuntimeError, "the cipher library failed (out of memory?)");
    else if (fallback)
        result = Py_BuildValue("(iOOni)", 0, Py_None, Py_None, (Py_ssize_t)-1, 6);
    else if (reason)
        result = Py_BuildValue("(iOOni)", 0, Py_None, Py_None, bad, reason);
    else if (failed >= 0)
        result = Py_BuildValue("(iOOni)", 0, Py_None, Py_None, failed, not_text ? 7 : 4);
    else if ((result = Py_BuildValue("(iOOni)", wide_out, offs, data, (Py_ssize_t)-1, 0)))
        done = 1;
out:
#ifndef CD_LIBGCRYPT
    if (work)
        ctx_close(work, 1);
#endif
    for (int k = 0; k < MAX_VERSIONS; k++)
        if (hs[k])
            ctx_close(hs[k], siv);
    if (dst && !done)
        OPENSSL_cleanse(dst, (size_t)bound); /* unauthenticated (or refused) plaintext: wipe */
    for (int k = 0; k < nkeys; k++)
        Py_XDECREF(keys[k]);
    if (scratch) {
        OPENSSL_cleanse(scratch, (size_t)longest + SLACK); /* a decoded ciphertext only, but wipe it */
        PyMem_RawFree(scratch);
    }
    if (dview.obj)
        PyBuffer_Release(&dview);
    Py_XDECREF(offs);
    Py_XDECREF(data);
    release(c.bufs, 3);
    return result;
}

/* -- masks and keyed hashes over whole columns ------------------------------------------- */

/* Characters (code points) of valid UTF-8: the bytes that do not continue one. */
static int64_t chars(const unsigned char *v, int64_t n) {
    int64_t count = 0, i = 0;
    for (; i + 8 <= n; i += 8) { /* ASCII runs 8 bytes at a time */
        uint64_t w;
        memcpy(&w, v + i, 8);
        if (!(w & 0x8080808080808080ull)) {
            count += 8;
            continue;
        }
        for (int j = 0; j < 8; j++)
            count += (v[i + j] & 0xC0) != 0x80;
    }
    for (; i < n; i++)
        count += (v[i] & 0xC0) != 0x80;
    return count;
}

/* The byte where the last `keep` characters of v start (0 if it has no more). */
static int64_t tail_start(const unsigned char *v, int64_t n, int64_t keep) {
    int64_t i = n;
    while (i > 0 && keep > 0) {
        i--;
        if ((v[i] & 0xC0) != 0x80)
            keep--;
    }
    return i;
}

/* One masked value into out (NULL: only its size). kind 'f' full, 'l' last4, 'e' email. */
static int64_t mask_one(int kind, const unsigned char *v, int64_t n, unsigned char *out) {
    if (kind == 'e') {
        int64_t at = -1;
        for (int64_t i = n - 1; i >= 0; i--)
            if (v[i] == '@') {
                at = i;
                break;
            }
        if (at >= 0) {
            if (out) {
                memcpy(out, "****", 4);
                memcpy(out + 4, v + at, (size_t)(n - at));
            }
            return 4 + n - at;
        }
        kind = 'f';
    }
    int64_t total = chars(v, n);
    if (kind == 'l' && total > 4) {
        int64_t start = total == n ? n - 4 : tail_start(v, n, 4); /* all ASCII: 4 bytes */
        if (out) {
            memset(out, '*', (size_t)(total - 4));
            memcpy(out + total - 4, v + start, (size_t)(n - start));
        }
        return total - 4 + n - start;
    }
    if (out)
        memset(out, '*', (size_t)total);
    return total;
}

/* 1 if v (n bytes) is all ASCII, 8 bytes at a time. */
static int ascii(const unsigned char *v, int64_t n) {
    uint64_t any = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, v + i, 32);
        any |= w[0] | w[1] | w[2] | w[3];
        if (any & 0x8080808080808080ull)
            return 0;
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, v + i, 8);
        any |= w;
    }
    for (; i < n; i++)
        any |= v[i];
    return !(any & 0x8080808080808080ull);
}

/* mask_column(kind, validity, offsets, data, wide, count, offset, alloc)
 *   -> (wide_out, offsets_bytes, data) ; kind "full", "last4" or "email" (see mask_one);
 * the input must be valid UTF-8 (Arrow strings are).
 * "full" and "last4" of an all-ASCII column keep every value's length and place:
 *   -> (wide, None, data): data is as long as the input's offsets reach, every byte
 * the input's values span masked ('*', the last four of each valid value longer than
 * four copied), the bytes before the first value zero; the caller reuses the input's
 * offsets, validity and array offset (no new offsets, no pass over the characters). */
static PyObject *py_mask_column(PyObject *self, PyObject *args) {
    const char *kindname;
    int wide;
    PyObject *alloc;
    Column c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTuple(args, "sy*y*y*pnnO", &kindname, &c.bufs[0].b, &c.bufs[1].b, &c.bufs[2].b, &wide,
                          &c.count, &c.offset, &alloc))
        return NULL;
    c.wide = wide;
    c.validity = c.bufs[0].b.len ? c.bufs[0].b.buf : NULL;
    c.offsets = c.bufs[1].b.buf;
    c.data = c.bufs[2].b.buf;
    for (int i = 0; i < 3; i++)
        c.bufs[i].held = 1;
    PyObject *offs = NULL, *data = NULL, *result = NULL;
    Py_buffer dview = {0};
    int kind = strcmp(kindname, "full") == 0 ? 'f' : strcmp(kindname, "last4") == 0 ? 'l'
             : strcmp(kindname, "email") == 0 ? 'e' : 0;
    if (!kind) {
        PyErr_SetString(PyExc_ValueError, "kind: full, last4 or email");
        goto out;
    }
    if (!col_check(&c))
        goto out;
    if (kind != 'e') {
        int64_t first = c.count ? col_off(&c, 0) : 0, end = c.count ? col_off(&c, c.count) : 0;
        int plain;
        Py_BEGIN_ALLOW_THREADS
        plain = ascii(c.data + first, end - first);
        Py_END_ALLOW_THREADS
        if (plain) {
            if (!(data = new_buffer(alloc, (Py_ssize_t)end, &dview)))
                goto out;
            unsigned char *dst = dview.buf;
            Py_BEGIN_ALLOW_THREADS
            memset(dst, 0, (size_t)first);
            memset(dst + first, '*', (size_t)(end - first));
            if (kind == 'l' && !c.wide && !c.validity) { /* the usual column: one load a row */
                const int32_t *o = (const int32_t *)c.offsets + c.offset;
                for (Py_ssize_t i = 0; i < c.count; i++)
                    if (o[i + 1] - o[i] > 4)
                        memcpy(dst + o[i + 1] - 4, c.data + o[i + 1] - 4, 4);
            } else if (kind == 'l')
                for (Py_ssize_t i = 0; i < c.count; i++) {
                    int64_t e = col_off(&c, i + 1);
                    if (e - col_off(&c, i) > 4 && col_valid(&c, i))
                        memcpy(dst + e - 4, c.data + e - 4, 4);
                }
            Py_END_ALLOW_THREADS
            result = Py_BuildValue("(iOO)", wide, Py_None, data);
            goto out;
        }
    }
    /* the output's size: at most the input's for 'f' and 'l' (a character masks to one
     * byte, the kept ones are copied), so one pass writes into a buffer of that size;
     * an email mask may grow a value ("a@b" -> "****@b"): a first pass sizes it. Both
     * passes run without the GIL (DuckDB's scan threads mask batches in parallel). */
    int64_t total = 0;
    if (kind == 'e') {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < c.count; i++)
            if (col_valid(&c, i))
                total += mask_one(kind, c.data + col_off(&c, i), col_off(&c, i + 1) - col_off(&c, i), NULL);
        Py_END_ALLOW_THREADS
    } else
        total = c.count ? col_off(&c, c.count) - col_off(&c, 0) : 0;
    int wide_out = total >= ((int64_t)1 << 31);
    offs = new_bytes((c.count + 1) * (wide_out ? 8 : 4));
    if (!offs || !(data = new_buffer(alloc, (Py_ssize_t)total, &dview)))
        goto out;
    unsigned char *dst = dview.buf;
    void *dof = PyBytes_AS_STRING(offs);
    Py_BEGIN_ALLOW_THREADS
    int64_t at = 0;
    for (Py_ssize_t i = 0; i < c.count; i++) {
        if (wide_out)
            ((int64_t *)dof)[i] = at;
        else
            ((int32_t *)dof)[i] = (int32_t)at;
        if (col_valid(&c, i))
            at += mask_one(kind, c.data + col_off(&c, i), col_off(&c, i + 1) - col_off(&c, i), dst + at);
    }
    if (wide_out)
        ((int64_t *)dof)[c.count] = at;
    else
        ((int32_t *)dof)[c.count] = (int32_t)at;
    if (at < total) /* multi-byte characters masked: no stale pool memory in the buffer */
        memset(dst + at, 0, (size_t)(total - at));
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(iOO)", wide_out, offs, data);
out:
    if (dview.obj)
        PyBuffer_Release(&dview);
    Py_XDECREF(offs);
    Py_XDECREF(data);
    release(c.bufs, 3);
    return result;
}

/* hmac_column(key, validity, offsets, data, wide, count, offset, alloc)
 *   -> (offsets_bytes int32, data): HMAC-SHA-256 of each valid value as 64 hex digits. */
static PyObject *py_hmac_column(PyObject *self, PyObject *args) {
    Py_buffer key;
    int wide;
    PyObject *alloc;
    Column c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTuple(args, "y*y*y*y*pnnO", &key, &c.bufs[0].b, &c.bufs[1].b, &c.bufs[2].b, &wide, &c.count,
                          &c.offset, &alloc))
        return NULL;
    c.wide = wide;
    c.validity = c.bufs[0].b.len ? c.bufs[0].b.buf : NULL;
    c.offsets = c.bufs[1].b.buf;
    c.data = c.bufs[2].b.buf;
    for (int i = 0; i < 3; i++)
        c.bufs[i].held = 1;
    PyObject *offs = NULL, *data = NULL, *result = NULL;
    Py_buffer dview = {0};
    int error = 0;
    if (!col_check(&c))
        goto out;
    int64_t nvalid = 0;
    for (Py_ssize_t i = 0; i < c.count; i++)
        nvalid += col_valid(&c, i);
    if (nvalid * 64 >= ((int64_t)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "too many values for one batch");
        goto out;
    }
    offs = new_bytes((c.count + 1) * 4);
    if (!offs || !(data = new_buffer(alloc, (Py_ssize_t)(nvalid * 64), &dview)))
        goto out;
    unsigned char *dst = dview.buf;
    int32_t *dof = (int32_t *)PyBytes_AS_STRING(offs);
    const unsigned char *k = key.buf;
    size_t klen = (size_t)key.len;
    static const char hex[] = "0123456789abcdef";
    Py_BEGIN_ALLOW_THREADS
    unsigned char mac[32];
    int32_t at = 0;
#ifdef CD_LIBGCRYPT
    gcry_md_hd_t h = NULL;
    error = gcry_md_open(&h, GCRY_MD_SHA256, GCRY_MD_FLAG_HMAC) != 0 || gcry_md_setkey(h, k, klen) != 0;
#else
    EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *h = hmac ? EVP_MAC_CTX_new(hmac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", "SHA256", 0), OSSL_PARAM_construct_end()};
    error = h == NULL || EVP_MAC_init(h, k, klen, params) != 1;
#endif
    for (Py_ssize_t i = 0; i < c.count && !error; i++) {
        dof[i] = at;
        if (!col_valid(&c, i))
            continue;
        const unsigned char *v = c.data + col_off(&c, i);
        size_t n = (size_t)(col_off(&c, i + 1) - col_off(&c, i));
#ifdef CD_LIBGCRYPT
        gcry_md_reset(h);
        gcry_md_write(h, v, n);
        const unsigned char *got = gcry_md_read(h, GCRY_MD_SHA256);
        if (!got) {
            error = 1;
            break;
        }
        memcpy(mac, got, 32);
#else
        size_t outl = 0;
        if (EVP_MAC_init(h, NULL, 0, NULL) != 1 || EVP_MAC_update(h, v, n) != 1 ||
            EVP_MAC_final(h, mac, &outl, sizeof mac) != 1) {
            error = 1;
            break;
        }
#endif
        for (int j = 0; j < 32; j++) {
            dst[at + 2 * j] = (unsigned char)hex[mac[j] >> 4];
            dst[at + 2 * j + 1] = (unsigned char)hex[mac[j] & 15];
        }
        at += 64;
    }
    dof[c.count] = at;
    OPENSSL_cleanse(mac, sizeof mac);
#ifdef CD_LIBGCRYPT
    gcry_md_close(h);
#else
    EVP_MAC_CTX_free(h);
    EVP_MAC_free(hmac);
#endif
    Py_END_ALLOW_THREADS
    if (error)
        PyErr_SetString(PyExc_RuntimeError, "the hash library failed (out of memory?)");
    else
        result = Py_BuildValue("(iOO)", 0, offs, data);
out:
    if (dview.obj)
        PyBuffer_Release(&dview);
    Py_XDECREF(offs);
    Py_XDECREF(data);
    PyBuffer_Release(&key);
    release(c.bufs, 3);
    return result;
}

/* base64_simd([level]) -> level: the base64 decoder in use (0 scalar, 1 SSSE3, 2 AVX2);
 * with a level, use at most that one (tests compare the decoders) and the CPU's best. */
static PyObject *py_base64_simd(PyObject *self, PyObject *args) {
    int level = -1;
    if (!PyArg_ParseTuple(args, "|i", &level))
        return NULL;
    if (level >= 0) {
        int best = simd_available();
        simd_level = level < best ? level : best;
    }
    return PyLong_FromLong(simd_level);
}

static PyObject *py_library(PyObject *self, PyObject *unused) {
    char buf[192];
    return PyUnicode_FromString(library(buf, sizeof buf));
}

static PyMethodDef methods[] = {
    {"seal_column", py_seal_column, METH_VARARGS, "Seal a whole Arrow column (see the C source)."},
    {"open_column", py_open_column, METH_VARARGS, "Open a whole Arrow column (see the C source)."},
    {"mask_column", py_mask_column, METH_VARARGS, "Mask a whole Arrow string column."},
    {"hmac_column", py_hmac_column, METH_VARARGS, "HMAC-SHA-256 (hex) of a whole column."},
    {"library", py_library, METH_NOARGS, "The cipher library and its version."},
    {"base64_simd", py_base64_simd, METH_VARARGS, "The base64 decoder in use (0 scalar, 1 SSSE3, 2 AVX2)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cfields",
                                    "Column encryption loops over Arrow buffers (cryptdisk.fields).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cfields(void) {
    memset(DEC, -1, sizeof DEC);
    for (int i = 0; i < 64; i++)
        DEC[(unsigned char)B64[i]] = (signed char)i;
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 256; c++)
            DQ[k][c] = DEC[c] < 0 ? BAD : (uint32_t)DEC[c] << (18 - 6 * k);
    simd_level = simd_available();
#ifdef CD_LIBGCRYPT
    if (gcry_check_version(GCRYPT_VERSION) == NULL) {
        PyErr_SetString(PyExc_ImportError, "libgcrypt is older than the headers cryptdisk was built with");
        return NULL;
    }
    if (!gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P))
        gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
#endif
    if (!gcm_library_init())
        return NULL;
    PyObject *m = PyModule_Create(&module);
    /* 2: open_column takes the utf8 flag (an older build's callers check this first);
     * 3: mask_column may answer (wide, None, data): the input's offsets serve */
    if (m && PyModule_AddIntConstant(m, "API", 3) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
