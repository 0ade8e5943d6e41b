/*
 * AES-256-GCM per record: libgcrypt against OpenSSL's EVP, called as the C VFS calls them
 * (cipher.c: a 16-byte nonce, the 24-byte associated data, one record, the tag), on
 * records of a WAL frame's size (4,120 bytes: a 24-byte frame header and a 4 KiB page).
 * Eight contexts are used in turn, as eight open files would be; with "cold", a 2 MiB
 * buffer is walked every fourth record so caches hold less of the contexts and data.
 * Not part of the extension; for docs/sqlite.md, "AES-GCM":
 *
 *   gcc -O2 csrc/tools/aead_speed.c -o /tmp/aead_speed -lgcrypt -lcrypto
 *   /tmp/aead_speed [bytes] [cold]
 */
#include <gcrypt.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CONTEXTS 8
#define ROUNDS 4
#define RECORDS 20000

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static unsigned char junk[2 << 20];

static void evict(void) {
    for (size_t i = 0; i < sizeof junk; i += 64)
        junk[i]++;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4120, cold = argc > 2 && atoi(argv[2]) != 0, len;
    static unsigned char in[CONTEXTS][70000], out[CONTEXTS][70000];
    unsigned char key[32] = {1}, nonce[16] = {2}, ad[24] = {3}, tag[16];
    gcry_cipher_hd_t g[CONTEXTS];
    EVP_CIPHER_CTX *o[CONTEXTS];
    if (n < 1 || n > 65536 || gcry_check_version(GCRYPT_VERSION) == NULL)
        return 2;
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    for (int k = 0; k < CONTEXTS; k++) {
        gcry_cipher_open(&g[k], GCRY_CIPHER_AES256, GCRY_CIPHER_MODE_GCM, 0);
        gcry_cipher_setkey(g[k], key, 32);
        o[k] = EVP_CIPHER_CTX_new();
        EVP_EncryptInit_ex(o[k], EVP_aes_256_gcm(), NULL, NULL, NULL);
        EVP_CIPHER_CTX_ctrl(o[k], EVP_CTRL_GCM_SET_IVLEN, 16, NULL);
        EVP_EncryptInit_ex(o[k], NULL, NULL, key, NULL);
    }
    printf("%s, %s; %d-byte records, %s caches\n", gcry_check_version(NULL),
           OpenSSL_version(OPENSSL_VERSION), n, cold ? "cold" : "warm");
    for (int r = 0; r < ROUNDS; r++) {
        double tg = 0, to = 0, t0;
        for (int i = 0; i < RECORDS; i++) {
            int k = i % CONTEXTS;
            nonce[0] = (unsigned char)i;
            if (cold && i % 4 == 0)
                evict();
            t0 = now();
            gcry_cipher_setiv(g[k], nonce, 16);
            gcry_cipher_authenticate(g[k], ad, sizeof ad);
            gcry_cipher_final(g[k]);
            gcry_cipher_encrypt(g[k], out[k], (size_t)n, in[k], (size_t)n);
            gcry_cipher_gettag(g[k], tag, 16);
            tg += now() - t0;
            if (cold && i % 4 == 0)
                evict();
            t0 = now();
            EVP_EncryptInit_ex(o[k], NULL, NULL, NULL, nonce);
            EVP_EncryptUpdate(o[k], NULL, &len, ad, sizeof ad);
            EVP_EncryptUpdate(o[k], out[k], &len, in[k], n);
            EVP_EncryptFinal_ex(o[k], out[k] + n, &len);
            EVP_CIPHER_CTX_ctrl(o[k], EVP_CTRL_GCM_GET_TAG, 16, tag);
            to += now() - t0;
        }
        printf("round %d: libgcrypt %.3f us, OpenSSL %.3f us per record\n", r + 1, tg / RECORDS * 1e6,
               to / RECORDS * 1e6);
    }
    for (int k = 0; k < CONTEXTS; k++) {
        gcry_cipher_close(g[k]);
        EVP_CIPHER_CTX_free(o[k]);
    }
    return 0;
}
