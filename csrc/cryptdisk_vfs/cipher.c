/* AES-GCM records: sealing and opening one segment, and their counters.
 *
 * The AEAD comes from libgcrypt when the build found it (CD_LIBGCRYPT, see setup.py),
 * else from OpenSSL's EVP; nonces always from OpenSSL's RAND_bytes. Both compute the
 * same standard AES-GCM (16-byte nonce, 16-byte tag), so files do not depend on the
 * build. libgcrypt is preferred because it is faster on the 4 KiB records SQLite writes:
 * libgcrypt 1.10.1 takes about 0.9-1.2 us per 4,120-byte record on the CI machine where
 * OpenSSL 3.0's EVP takes 1.2-1.9 us (docs/sqlite.md, "AES-GCM"). */
#include "cvfs.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

/* -- the cipher ------------------------------------------------------------ */

/* Process-wide counts of records sealed and opened, and their bytes (for tests and tuning). */
unsigned long long n_seal, n_seal_bytes, n_unseal, n_unseal_bytes, n_tail_saves, n_tail_syncs;

static void cd_set_index(cdFile *p, sqlite3_int64 index) {
    unsigned long long v = (unsigned long long)index;
    for (int i = 0; i < 8; i++)
        p->ad[16 + i] = (unsigned char)(v >> (8 * i));
}

/* Bumped in a forked child, so that it draws its own nonces rather than the parent's pool. */
static volatile unsigned long cd_fork_generation = 1;

static void on_fork_child(void) { cd_fork_generation++; }

unsigned long cd_generation(void) { return cd_fork_generation; }

static char library_name[64]; /* set once, by init_once */

static void init_once(void) {
    pthread_atfork(NULL, NULL, on_fork_child);
#ifdef CD_LIBGCRYPT
    /* libgcrypt must be initialised before use; a library initialises it only if the
     * application has not (libgcrypt manual, "Initializing the library") */
    const char *version = gcry_check_version(GCRYPT_VERSION);
    if (version == NULL)
        return; /* older than the headers: library_name stays empty */
    if (!gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P))
        gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    snprintf(library_name, sizeof library_name, "libgcrypt %s", version);
#else
    snprintf(library_name, sizeof library_name, "%s", OpenSSL_version(OPENSSL_VERSION));
#endif
}

/* Once per process, before the first file is opened (called when a VFS is registered):
 * SQLITE_OK, or SQLITE_ERROR if the cipher library cannot be used. */
int cd_cipher_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_once);
    return library_name[0] ? SQLITE_OK : SQLITE_ERROR;
}

/* The AEAD's library and version ("libgcrypt 1.10.1"), "" before cd_cipher_init. */
const char *cd_cipher_library(void) { return library_name; }

/* The next fresh random nonce of this file, from a pool drawn NONCE_POOL bytes at a time
 * (RAND_bytes costs the same for 16 bytes as for 1 KiB); never reused, refilled after fork. */
static int next_nonce(cdFile *p, unsigned char *out) {
    if (p->nonce_generation != cd_fork_generation || p->nonce_used + NONCE > NONCE_POOL) {
        if (RAND_bytes(p->nonce_pool, NONCE_POOL) != 1)
            return SQLITE_IOERR;
        p->nonce_used = 0;
        p->nonce_generation = cd_fork_generation;
    }
    memcpy(out, p->nonce_pool + p->nonce_used, NONCE);
    memset(p->nonce_pool + p->nonce_used, 0, NONCE);
    p->nonce_used += NONCE;
    return SQLITE_OK;
}

void cd_wipe(void *buf, size_t n) {
    explicit_bzero(buf, n);
}

/* -- the AEAD: one encrypting and one decrypting context per file ------------- */

#ifdef CD_LIBGCRYPT

int cd_aead_open(cdFile *p, const unsigned char *dek, int len) {
    int algo = len == 32 ? GCRY_CIPHER_AES256 : GCRY_CIPHER_AES128;
    if (gcry_cipher_open(&p->enc, algo, GCRY_CIPHER_MODE_GCM, 0) != 0) {
        p->enc = NULL;
        return SQLITE_NOMEM;
    }
    if (gcry_cipher_open(&p->dec, algo, GCRY_CIPHER_MODE_GCM, 0) != 0) {
        p->dec = NULL;
        return SQLITE_NOMEM;
    }
    if (gcry_cipher_setkey(p->enc, dek, (size_t)len) != 0 || gcry_cipher_setkey(p->dec, dek, (size_t)len) != 0)
        return SQLITE_NOMEM;
    return SQLITE_OK;
}

void cd_aead_close(cdFile *p) {
    gcry_cipher_close(p->enc); /* wipes the key schedule; NULL is allowed */
    gcry_cipher_close(p->dec);
    p->enc = p->dec = NULL;
}

/* nonce(16) || ciphertext || tag(16) of n bytes into dst; the nonce is already there. */
static int aead_seal(cdFile *p, const unsigned char *plain, int n, unsigned char *dst) {
    gcry_cipher_hd_t h = p->enc;
    return gcry_cipher_setiv(h, dst, NONCE) == 0 && gcry_cipher_authenticate(h, p->ad, sizeof p->ad) == 0 &&
           gcry_cipher_final(h) == 0 &&
           (n == 0 || gcry_cipher_encrypt(h, dst + NONCE, (size_t)n, plain, (size_t)n) == 0) &&
           gcry_cipher_gettag(h, dst + NONCE + n, TAG) == 0;
}

/* 1 if a record with n plaintext bytes authenticates; out holds them (unchecked if 0). */
static int aead_open(cdFile *p, const unsigned char *record, int n, unsigned char *out) {
    gcry_cipher_hd_t h = p->dec;
    return gcry_cipher_setiv(h, record, NONCE) == 0 && gcry_cipher_authenticate(h, p->ad, sizeof p->ad) == 0 &&
           gcry_cipher_final(h) == 0 && gcry_cipher_decrypt(h, out, (size_t)n, record + NONCE, (size_t)n) == 0 &&
           gcry_cipher_checktag(h, record + NONCE + n, TAG) == 0;
}

#else /* OpenSSL EVP */

int cd_aead_open(cdFile *p, const unsigned char *dek, int len) {
    const EVP_CIPHER *cipher = len == 32 ? EVP_aes_256_gcm() : EVP_aes_128_gcm();
    p->enc = EVP_CIPHER_CTX_new();
    p->dec = EVP_CIPHER_CTX_new();
    if (!p->enc || !p->dec || EVP_EncryptInit_ex(p->enc, cipher, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
        EVP_EncryptInit_ex(p->enc, NULL, NULL, dek, NULL) != 1 ||
        EVP_DecryptInit_ex(p->dec, cipher, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
        EVP_DecryptInit_ex(p->dec, NULL, NULL, dek, NULL) != 1)
        return SQLITE_NOMEM;
    return SQLITE_OK;
}

void cd_aead_close(cdFile *p) {
    EVP_CIPHER_CTX_free(p->enc); /* cleanses the key schedule; NULL is allowed */
    EVP_CIPHER_CTX_free(p->dec);
    p->enc = p->dec = NULL;
}

static int aead_seal(cdFile *p, const unsigned char *plain, int n, unsigned char *dst) {
    int len = 0;
    return EVP_EncryptInit_ex(p->enc, NULL, NULL, NULL, dst) == 1 &&
           EVP_EncryptUpdate(p->enc, NULL, &len, p->ad, sizeof p->ad) == 1 &&
           (n == 0 || EVP_EncryptUpdate(p->enc, dst + NONCE, &len, plain, n) == 1) &&
           EVP_EncryptFinal_ex(p->enc, dst + NONCE + n, &len) == 1 &&
           EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_GCM_GET_TAG, TAG, dst + NONCE + n) == 1;
}

static int aead_open(cdFile *p, const unsigned char *record, int n, unsigned char *out) {
    int len = 0;
    return EVP_DecryptInit_ex(p->dec, NULL, NULL, NULL, record) == 1 &&
           EVP_DecryptUpdate(p->dec, NULL, &len, p->ad, sizeof p->ad) == 1 &&
           EVP_DecryptUpdate(p->dec, out, &len, record + NONCE, n) == 1 &&
           EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_GCM_SET_TAG, TAG, (void *)(record + NONCE + n)) == 1 &&
           EVP_DecryptFinal_ex(p->dec, out + len, &len) == 1;
}

#endif

/* Seal n plaintext bytes as segment index into dst (n + OVERHEAD bytes). */
int cd_seal(cdFile *p, sqlite3_int64 index, const unsigned char *plain, int n, unsigned char *dst) {
    n_seal++;
    n_seal_bytes += (unsigned long long)n;
    if (next_nonce(p, dst) != SQLITE_OK)
        return SQLITE_IOERR;
    cd_set_index(p, index);
    return aead_seal(p, plain, n, dst) ? SQLITE_OK : SQLITE_IOERR;
}

/* Open a record of got bytes; 1 if it authenticates, else 0 with out wiped. */
int cd_unseal(cdFile *p, sqlite3_int64 index, unsigned char *record, sqlite3_int64 got, unsigned char *out) {
    int n = (int)(got - OVERHEAD), ok;
    if (n <= 0)
        return 0;
    n_unseal++;
    n_unseal_bytes += (unsigned long long)n;
    cd_set_index(p, index);
    ok = aead_open(p, record, n, out);
    if (!ok)
        cd_wipe(out, (size_t)n); /* the library wrote unauthenticated plaintext: wipe it */
    return ok;
}
