"""NIST's FF1 samples (SP 800-38G, "FF1 samples" examples 1-9: AES-128/192/256)."""

K128 = "2B7E151628AED2A6ABF7158809CF4F3C"
K192 = K128 + "EF4359D8D580AA4F"
K256 = K192 + "7F036D6F04FC6A94"
T10 = "39383736353433323130"
T36 = "3737373770717273373737"
A10 = "0123456789"
A36 = "0123456789abcdefghi"

# (sample, key hex, radix, tweak hex, plaintext, ciphertext)
SAMPLES = [
    (1, K128, 10, "", A10, "2433477484"),
    (2, K128, 10, T10, A10, "6124200773"),
    (3, K128, 36, T36, A36, "a9tv40mll9kdu509eum"),
    (4, K192, 10, "", A10, "2830668132"),
    (5, K192, 10, T10, A10, "2496655549"),
    (6, K192, 36, T36, A36, "xbj3kv35jrawxv32ysr"),
    (7, K256, 10, "", A10, "6657667009"),
    (8, K256, 10, T10, A10, "1001623463"),
    (9, K256, 36, T36, A36, "xs8a0azh2avyalyzuwd"),
]
