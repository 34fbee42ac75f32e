package workflow_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// TestFingerprintPinned compares fingerprints with the values a build before the
// fingerprint's scratch space was pooled computed for the same requests (v2 of JSON,
// raw, empty and duplicate-name bodies; v3 under a member list): stored rows must
// keep matching, so these bytes never change.
func TestFingerprintPinned(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, want string }{
		{`{"amount":1999,"currency":"usd","source":"tok_visa"}`, "02a16d4d23be662b82440b5da99fc3f2b3bc8d1571d951b0969e2f62ddfd4cf472"},
		{`{"b":[1,2.50,{"z":null,"a":"\u00e9"}],"a":-0.0e5}`, "02512b378ba639228172a46667dfb9630fd2602cf0970b3ed0a14cb61bcdc94a59"},
		{`amount=1999&currency=usd`, "027ec74ce976b7a6cb9b5cacad59ad3125dcf71b71b0a8d75c9149199010ee6544"},
		{``, "023d1fd0e9396c75c2f8d2d811d2268539d5a10e9df95ef126b7c4df898e3ac158"},
		{`{"a":1,"a":2}`, "0278b049ed8ac50275befaabdd3e9f950ca64556b48134b48ed9fa4cd075612cae"},
	} {
		// twice: the second from a pooled fingerprinter
		for range 2 {
			require.Equal(t, c.want, hex.EncodeToString(workflow.WholeFingerprint("POST", "/v1/charges", []byte(c.body))), c.body)
		}
	}
	for _, c := range []struct{ body, want string }{
		{`{"amount":1999,"currency":"usd","source":"tok_visa"}`, "035cf2b38e7ecb01b6f0fa60d1bb32be56c6b6071a4934d7f37fb91878f516fc0043541f4a7aac2830ccad872e477f768fd9f9bc634814e38d998cd0f6f83b4dd25a190b4e7f83dced"},
		{`{"b":[1,2.50,{"z":null,"a":"\u00e9"}],"a":-0.0e5}`, "035cf2b38e7ecb01b693183bfd76ad0bfc74b883a9129470333f3ebb2ede971c79f7731259e76aad9e9b109525176ef3d91b3b94353b6be7e323513509fce79769f5aa91bac404c703"},
	} {
		for range 2 {
			fp, err := workflow.Fingerprint("PUT", "/r", []byte(c.body), []string{"/amount", "/b/2/a", "/missing"})
			require.NoError(t, err)
			require.Equal(t, c.want, hex.EncodeToString(fp), c.body)
		}
	}
}
