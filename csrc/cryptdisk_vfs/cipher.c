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
unsigned long long n_seal, n_seal_bytes, n_unseal, n_unseal_bytes;

static void cd_set_index(cdFile *p, sqlite3_int64 index) {
    unsigned long long v = (unsigned long long)index;
    for (int i = 0; i < 8; i++)
        p->ad[16 + i] = (unsigned char)(v >> (8 * i));
}

/* Seal n plaintext bytes as segment index into dst (n + OVERHEAD bytes). */
int cd_seal(cdFile *p, sqlite3_int64 index, const unsigned char *plain, int n, unsigned char *dst) {
    int len = 0;
    n_seal++;
    n_seal_bytes += (unsigned long long)n;
    if (RAND_bytes(dst, NONCE) != 1)
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
        OPENSSL_cleanse(out, (size_t)n); /* OpenSSL wrote unauthenticated plaintext: wipe it */
    return ok;
}
