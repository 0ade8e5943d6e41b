/* AES-GCM records: sealing and opening one segment (OpenSSL EVP), and their counters. */
#include "cvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

/* -- the cipher ------------------------------------------------------------ */

/* Process-wide counts of records sealed and opened, and their bytes (for tests and tuning). */
unsigned long long n_seal, n_seal_bytes, n_unseal, n_unseal_bytes, n_tail_saves;

static void cd_set_index(cdFile *p, sqlite3_int64 index) {
    unsigned long long v = (unsigned long long)index;
    for (int i = 0; i < 8; i++)
        p->ad[16 + i] = (unsigned char)(v >> (8 * i));
}

/* Bumped in a forked child, so that it draws its own nonces rather than the parent's pool. */
static volatile unsigned long cd_fork_generation = 1;

static void on_fork_child(void) { cd_fork_generation++; }

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, on_fork_child); }

unsigned long cd_generation(void) { return cd_fork_generation; }

/* Once per process, before the first file is opened (called when a VFS is registered). */
void cd_cipher_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
}

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

/* Seal n plaintext bytes as segment index into dst (n + OVERHEAD bytes). */
int cd_seal(cdFile *p, sqlite3_int64 index, const unsigned char *plain, int n, unsigned char *dst) {
    int len = 0;
    n_seal++;
    n_seal_bytes += (unsigned long long)n;
    if (next_nonce(p, dst) != SQLITE_OK)
        return SQLITE_IOERR;
    cd_set_index(p, index);
    if (EVP_EncryptInit_ex(p->enc, NULL, NULL, NULL, dst) != 1 ||
        EVP_EncryptUpdate(p->enc, NULL, &len, p->ad, sizeof p->ad) != 1 ||
        (n > 0 && EVP_EncryptUpdate(p->enc, dst + NONCE, &len, plain, n) != 1) ||
        EVP_EncryptFinal_ex(p->enc, dst + NONCE + n, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(p->enc, EVP_CTRL_GCM_GET_TAG, TAG, dst + NONCE + n) != 1)
        return SQLITE_IOERR;
    return SQLITE_OK;
}

/* Open a record of got bytes; 1 if it authenticates, else 0 with out wiped. */
int cd_unseal(cdFile *p, sqlite3_int64 index, unsigned char *record, sqlite3_int64 got, unsigned char *out) {
    int n = (int)(got - OVERHEAD), len = 0, ok;
    if (n <= 0)
        return 0;
    n_unseal++;
    n_unseal_bytes += (unsigned long long)n;
    cd_set_index(p, index);
    ok = EVP_DecryptInit_ex(p->dec, NULL, NULL, NULL, record) == 1 &&
         EVP_DecryptUpdate(p->dec, NULL, &len, p->ad, sizeof p->ad) == 1 &&
         EVP_DecryptUpdate(p->dec, out, &len, record + NONCE, n) == 1 &&
         EVP_CIPHER_CTX_ctrl(p->dec, EVP_CTRL_GCM_SET_TAG, TAG, record + NONCE + n) == 1 &&
         EVP_DecryptFinal_ex(p->dec, out + len, &len) == 1;
    if (!ok)
        cd_wipe(out, (size_t)n); /* OpenSSL wrote unauthenticated plaintext: wipe it */
    return ok;
}
