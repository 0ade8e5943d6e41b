/*
 * Opening short AES-256-GCM values one by one, as cryptdisk.fields' C loop does
 * (csrc/cryptdisk_fields/fields.c: a 12-byte nonce, no associated data, one value, the tag):
 *
 *   libgcrypt   its four calls on one keyed handle (setiv, final, decrypt, checktag);
 *   libsodium   a precomputed state (crypto_aead_aes256gcm_beforenm once, then
 *               crypto_aead_aes256gcm_decrypt_detached_afternm per value; AES-NI and PCLMUL);
 *   ipsec-mb    Intel's multi-buffer library (intel-ipsec-mb, libipsec-mb-dev), precomputed
 *               key data (IMB_AES256_GCM_PRE once): its single call per value
 *               (IMB_AES256_GCM_DEC, which returns the tag it computed; the tag is compared
 *               with CRYPTO_memcmp, constant time, and the plaintext wiped when it differs),
 *               on the manager init_mb_mgr_auto picks (VAES/AVX-512 where the CPU has them)
 *               and on its AVX2 manager; its init/dec_update/dec_finalize calls; and its
 *               job burst API (IMB_SUBMIT_BURST, 64 GCM jobs per burst).
 *
 * They alternate over the same 20,000 values, 100 times, so a loaded machine slows all
 * alike; CPU time of this thread, nanoseconds per value. A third of the values is sealed
 * by each of libgcrypt, libsodium and ipsec-mb and every variant opens all of them (a
 * wrong tag is counted and printed); then each opens a value with one bit flipped, which
 * must fail. Not part of the extension; for docs/fields.md, "Measured":
 *
 *   gcc -O2 csrc/tools/gcm_short.c -o /tmp/gcm_short -lgcrypt -lsodium -lIPSec_MB -lcrypto
 *   /tmp/gcm_short [value bytes, default 16]
 *
 * (Debian: libgcrypt20-dev libsodium-dev libipsec-mb-dev libssl-dev.)
 */
#include <gcrypt.h>
#include <intel-ipsec-mb.h>
#include <openssl/crypto.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VALUES 20000
#define ROUNDS 100
#define BURST 64
#define VARIANTS 6

static const char *NAMES[VARIANTS] = {"libgcrypt", "libsodium", "ipsec-mb DEC (auto)", "ipsec-mb DEC (avx2)",
                                      "ipsec-mb init/update/finalize (auto)", "ipsec-mb burst (auto)"};

static double cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    size_t n, rec;
    gcry_cipher_hd_t h;
    crypto_aead_aes256gcm_state st;
    IMB_MGR *mb, *mb2; /* init_mb_mgr_auto's, the AVX2 one */
    struct gcm_key_data *kd, *kd2; /* key data per manager (their layouts differ) */
    unsigned char *out; /* BURST values' room */
} Bench;

/* one value: 1 if it authenticates (its plaintext in out), else 0 (out wiped) */
static int open_one(Bench *b, int variant, const unsigned char *v, unsigned char *out) {
    size_t n = b->n;
    const unsigned char *ct = v + 12, *tag = v + 12 + n;
    unsigned char got[16];
    struct gcm_context_data ctx;
    int ok;
    switch (variant) {
    case 0:
        ok = gcry_cipher_setiv(b->h, v, 12) == 0 && gcry_cipher_final(b->h) == 0 &&
             gcry_cipher_decrypt(b->h, out, n, ct, n) == 0 && gcry_cipher_checktag(b->h, tag, 16) == 0;
        break;
    case 1:
        ok = crypto_aead_aes256gcm_decrypt_detached_afternm(out, NULL, ct, n, tag, NULL, 0, v, &b->st) == 0;
        break;
    case 2:
        IMB_AES256_GCM_DEC(b->mb, b->kd, &ctx, out, ct, n, v, NULL, 0, got, 16);
        ok = CRYPTO_memcmp(got, tag, 16) == 0;
        break;
    case 3:
        IMB_AES256_GCM_DEC(b->mb2, b->kd2, &ctx, out, ct, n, v, NULL, 0, got, 16);
        ok = CRYPTO_memcmp(got, tag, 16) == 0;
        break;
    default:
        IMB_AES256_GCM_INIT(b->mb, b->kd, &ctx, v, NULL, 0);
        IMB_AES256_GCM_DEC_UPDATE(b->mb, b->kd, &ctx, out, ct, n);
        IMB_AES256_GCM_DEC_FINALIZE(b->mb, b->kd, &ctx, got, 16);
        ok = CRYPTO_memcmp(got, tag, 16) == 0;
    }
    if (!ok)
        OPENSSL_cleanse(out, n);
    return ok;
}

/* count values, BURST at a time through the job API: the number that fail */
static long open_burst(Bench *b, const unsigned char *vals, size_t count) {
    IMB_JOB *jobs[BURST];
    unsigned char tags[BURST][16];
    long bad = 0;
    for (size_t i = 0; i < count; i += BURST) {
        uint32_t k = count - i < BURST ? (uint32_t)(count - i) : BURST, done = 0;
        if (IMB_GET_NEXT_BURST(b->mb, k, jobs) < k) {
            IMB_FLUSH_BURST(b->mb, BURST, jobs);
            if (IMB_GET_NEXT_BURST(b->mb, k, jobs) < k)
                return -1;
        }
        for (uint32_t j = 0; j < k; j++) {
            const unsigned char *v = vals + (i + j) * b->rec;
            IMB_JOB *job = jobs[j];
            job->cipher_mode = IMB_CIPHER_GCM;
            job->hash_alg = IMB_AUTH_AES_GMAC;
            job->cipher_direction = IMB_DIR_DECRYPT;
            job->chain_order = IMB_ORDER_HASH_CIPHER;
            job->enc_keys = job->dec_keys = b->kd;
            job->key_len_in_bytes = IMB_KEY_256_BYTES;
            job->src = v + 12;
            job->dst = b->out + j * b->n;
            job->cipher_start_src_offset_in_bytes = 0;
            job->msg_len_to_cipher_in_bytes = b->n;
            job->hash_start_src_offset_in_bytes = 0;
            job->msg_len_to_hash_in_bytes = b->n;
            job->iv = v;
            job->iv_len_in_bytes = 12;
            job->u.GCM.aad = NULL;
            job->u.GCM.aad_len_in_bytes = 0;
            job->auth_tag_output = tags[j];
            job->auth_tag_output_len_in_bytes = 16;
            job->user_data = (void *)v;
        }
        done = IMB_SUBMIT_BURST(b->mb, k, jobs);
        if (done == 0 && imb_get_errno(b->mb) != 0)
            return -1;
        while (done < k) {
            uint32_t more = IMB_FLUSH_BURST(b->mb, k - done, jobs + done);
            if (more == 0)
                return -1;
            done += more;
        }
        for (uint32_t j = 0; j < k; j++) {
            IMB_JOB *job = jobs[j];
            const unsigned char *v = job->user_data;
            if (job->status != IMB_STATUS_COMPLETED ||
                CRYPTO_memcmp(job->auth_tag_output, v + 12 + b->n, 16) != 0) {
                OPENSSL_cleanse(job->dst, b->n);
                bad++;
            }
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    Bench b;
    memset(&b, 0, sizeof b);
    size_t n = argc > 1 ? (size_t)atoi(argv[1]) : 16, rec = 12 + n + 16;
    unsigned char key[32] = {1}, *ct = malloc(VALUES * rec), *tampered = malloc(rec);
    long bad[VARIANTS] = {0}, caught = 0;
    double t[VARIANTS] = {0};
    IMB_ARCH arch = IMB_ARCH_NONE;
    b.n = n, b.rec = rec;
    b.out = malloc(BURST * (n + 1));
    b.kd = aligned_alloc(64, (sizeof *b.kd + 63) / 64 * 64);
    b.kd2 = aligned_alloc(64, (sizeof *b.kd + 63) / 64 * 64);
    if (n < 1 || n > 1 << 20 || !ct || !tampered || !b.out || !b.kd || !b.kd2 || sodium_init() < 0 ||
        gcry_check_version(GCRYPT_VERSION) == NULL)
        return 2;
    if (!crypto_aead_aes256gcm_is_available()) {
        puts("libsodium: AES-256-GCM unavailable on this CPU (no AES-NI or PCLMUL)");
        return 1;
    }
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    gcry_cipher_open(&b.h, GCRY_CIPHER_AES256, GCRY_CIPHER_MODE_GCM, 0);
    gcry_cipher_setkey(b.h, key, 32);
    crypto_aead_aes256gcm_beforenm(&b.st, key);
    if (!(b.mb = alloc_mb_mgr(0)) || !(b.mb2 = alloc_mb_mgr(0)))
        return 2;
    init_mb_mgr_auto(b.mb, &arch);
    init_mb_mgr_avx2(b.mb2);
    IMB_AES256_GCM_PRE(b.mb, key, b.kd); /* the key schedule and the GHASH key's powers */
    IMB_AES256_GCM_PRE(b.mb2, key, b.kd2);
    if (imb_get_errno(b.mb) || imb_get_errno(b.mb2))
        return 2;
    randombytes_buf(ct, VALUES * rec);
    for (size_t i = 0; i < VALUES; i++) { /* a third sealed by each library */
        unsigned char *v = ct + i * rec;
        struct gcm_context_data ctx;
        if (i % 3 == 1)
            crypto_aead_aes256gcm_encrypt_detached_afternm(v + 12, v + 12 + n, NULL, v + 12, n, NULL, 0, NULL, v, &b.st);
        else if (i % 3 == 2)
            IMB_AES256_GCM_ENC(b.mb, b.kd, &ctx, v + 12, v + 12, n, v, NULL, 0, v + 12 + n, 16);
        else if (gcry_cipher_setiv(b.h, v, 12) || gcry_cipher_final(b.h) ||
                 gcry_cipher_encrypt(b.h, v + 12, n, NULL, 0) || gcry_cipher_gettag(b.h, v + 12 + n, 16))
            return 2;
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int x = 0; x < VARIANTS; x++) {
            int var = (x + r) % VARIANTS; /* a different order each round */
            double t0 = cpu();
            if (var == 5) {
                long got = open_burst(&b, ct, VALUES);
                if (got < 0) {
                    printf("ipsec-mb burst failed: %s\n", imb_get_strerror(imb_get_errno(b.mb)));
                    return 2;
                }
                bad[var] += got;
            } else
                for (size_t i = 0; i < VALUES; i++)
                    bad[var] += !open_one(&b, var, ct + i * rec, b.out);
            t[var] += cpu() - t0;
        }
    /* a flipped bit, in the ciphertext, then in the tag: each variant must refuse it */
    for (int where = 0; where < 2; where++) {
        memcpy(tampered, ct + rec, rec);
        tampered[where ? rec - 1 : 12] ^= 1;
        for (int var = 0; var < VARIANTS; var++) {
            int refused = var == 5 ? open_burst(&b, tampered, 1) == 1 : !open_one(&b, var, tampered, b.out);
            int wiped = 1;
            for (size_t i = 0; i < n; i++)
                wiped &= b.out[i] == 0;
            caught += refused && wiped;
        }
    }
    printf("%s, libsodium %s, ipsec-mb %s (auto: %s); %zu-byte values, ns per value to open:\n",
           gcry_check_version(NULL), sodium_version_string(), imb_get_version_str(),
           arch == IMB_ARCH_AVX512 ? "avx512" : arch == IMB_ARCH_AVX2 ? "avx2" : arch == IMB_ARCH_AVX ? "avx" : "sse",
           n);
    for (int var = 0; var < VARIANTS; var++)
        printf("  %-38s %6.1f  (%.2fx libgcrypt)  wrong tags %ld\n", NAMES[var], t[var] / VALUES / ROUNDS * 1e9,
               t[var] / t[0], bad[var]);
    printf("  tampered values refused (and wiped): %ld of %d\n", caught, 2 * VARIANTS);
    gcry_cipher_close(b.h);
    free_mb_mgr(b.mb);
    free_mb_mgr(b.mb2);
    return caught != 2 * VARIANTS || bad[0] || bad[1] || bad[2] || bad[3] || bad[4] || bad[5];
}
