package channels

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Keys are the secrets the channels sign their callbacks with.
//
// Alipay signs with RSA2 (SHA256withRSA) and WeChat Pay with its platform
// private key (SHA256withRSA, the certificate named by Wechatpay-Serial); the
// merchant verifies with a public key. This example stands in an HMAC-SHA256
// under a shared test key for both, over the very string the channel signs,
// so that the stream generator can sign. Stripe really does sign with
// HMAC-SHA256 under the endpoint's secret. Swap the verification for the
// channel SDK's, or crypto/rsa, in production.
type Keys struct {
	Alipay          []byte
	WeChatPay       []byte
	WeChatPaySerial string // the platform certificate serial the key stands for
	Stripe          []byte // the endpoint secret (whsec_…)
}

// TestKeys are the keys testdata/channels is signed with. Test values, known
// to everyone: never accept them outside tests.
func TestKeys() Keys {
	return Keys{
		Alipay:          []byte("idem-test-alipay-key-not-a-secret"),
		WeChatPay:       []byte("idem-test-wechatpay-key-not-a-secret"),
		WeChatPaySerial: "5157F09EFDC096DE15EBE81A47057A72TEST",
		Stripe:          []byte("whsec_idem_test_not_a_secret"),
	}
}

func hmacSHA256(key []byte, parts ...string) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range parts {
		h.Write([]byte(p))
	}
	return h.Sum(nil)
}
