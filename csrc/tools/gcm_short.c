/*
 * Opening short AES-256-GCM values one by one, as cryptdisk.fields' C loop does
 * (csrc/cryptdisk_fields/fields.c: a 12-byte nonce, no associated data, one value, the tag):
 * libgcrypt's four calls on one keyed handle (setiv, final, decrypt, checktag) against
 * libsodium's precomputed state (crypto_aead_aes256gcm_beforenm once, then
 * crypto_aead_aes256gcm_decrypt_detached_afternm per value; it needs AES-NI and PCLMUL).
 * The two alternate over the same 20,000 values, 100 times, so a loaded machine slows
 * both alike; CPU time of this thread, nanoseconds per value. Each library opens the
 * other's values (a wrong tag is counted and printed). Not part of the extension; for
 * docs/fields.md, "Measured":
 *
 *   gcc -O2 csrc/tools/gcm_short.c -o /tmp/gcm_short -lgcrypt -lsodium   (libsodium-dev)
 *   /tmp/gcm_short [value bytes, default 16]
 */
#include <gcrypt.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define VALUES 20000
#define ROUNDS 100

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atoi(argv[1]) : 16, rec = 12 + n + 16;
    unsigned char key[32] = {1}, *ct = malloc(VALUES * rec), *out = malloc(n + 1);
    crypto_aead_aes256gcm_state st;
    gcry_cipher_hd_t h;
    long bad = 0;
    double t[3] = {0};
    if (n < 1 || n > 1 << 20 || !ct || !out || sodium_init() < 0 || gcry_check_version(GCRYPT_VERSION) == NULL)
        return 2;
    if (!crypto_aead_aes256gcm_is_available()) {
        puts("libsodium: AES-256-GCM unavailable on this CPU (no AES-NI or PCLMUL)");
        return 1;
    }
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    gcry_cipher_open(&h, GCRY_CIPHER_AES256, GCRY_CIPHER_MODE_GCM, 0);
    gcry_cipher_setkey(h, key, 32);
    crypto_aead_aes256gcm_beforenm(&st, key);
    randombytes_buf(ct, VALUES * rec);
    for (size_t i = 0; i < VALUES; i++) { /* half sealed by each library */
        unsigned char *v = ct + i * rec;
        if (i % 2)
            crypto_aead_aes256gcm_encrypt_detached_afternm(v + 12, v + 12 + n, NULL, v + 12, n, NULL, 0, NULL, v, &st);
        else if (gcry_cipher_setiv(h, v, 12) || gcry_cipher_final(h) || gcry_cipher_encrypt(h, v + 12, n, NULL, 0) ||
                 gcry_cipher_gettag(h, v + 12 + n, 16))
            return 2;
    }
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = cpu();
        for (size_t i = 0; i < VALUES; i++) {
            const unsigned char *v = ct + i * rec;
            if (gcry_cipher_setiv(h, v, 12) || gcry_cipher_final(h) || gcry_cipher_decrypt(h, out, n, v + 12, n) ||
                gcry_cipher_checktag(h, v + 12 + n, 16))
                bad++;
        }
        double t1 = cpu();
        for (size_t i = 0; i < VALUES; i++) {
            const unsigned char *v = ct + i * rec;
            bad += crypto_aead_aes256gcm_decrypt_detached_afternm(out, NULL, v + 12, n, v + 12 + n, NULL, 0, v, &st) != 0;
        }
        double t2 = cpu();
        for (size_t i = 0; i < VALUES; i++) {
            unsigned char tag[16];
            const unsigned char *v = ct + i * rec;
            bad += crypto_aead_aes256gcm_encrypt_detached_afternm(out, tag, NULL, v + 12, n, NULL, 0, NULL, v, &st) != 0;
        }
        double t3 = cpu();
        t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2;
    }
    printf("%s, libsodium %s; %zu-byte values, ns per value: open libgcrypt %.1f, libsodium %.1f; "
           "seal libsodium %.1f; wrong tags %ld\n",
           gcry_check_version(NULL), sodium_version_string(), n, t[0] / VALUES / ROUNDS * 1e9,
           t[1] / VALUES / ROUNDS * 1e9, t[2] / VALUES / ROUNDS * 1e9, bad);
    gcry_cipher_close(h);
    return bad != 0;
}
