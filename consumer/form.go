package consumer

import (
	"fmt"
	"mime"
	"net/url"
	"strings"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/simplifiedchinese"
)

// parseForm reads m's form-urlencoded payload, for ByFormField and
// FormFields: URL-decoded, and from the charset m declares into UTF-8.
func parseForm(m *Message) (url.Values, error) {
	form, err := url.ParseQuery(string(m.Value))
	if err != nil {
		return nil, fmt.Errorf("%w: payload is not a valid form: %v", ErrBadPayload, err)
	}
	cs, err := formCharset(m, form)
	if err != nil {
		return nil, err
	}
	if cs == nil {
		return form, nil
	}
	dec := cs.NewDecoder()
	utf8 := make(url.Values, len(form))
	for k, vs := range form {
		dk, err := decodeForm(dec, k)
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			dv, err := decodeForm(dec, v)
			if err != nil {
				return nil, err
			}
			utf8[dk] = append(utf8[dk], dv)
		}
	}
	return utf8, nil
}

// formCharset is the encoding m's form is in: nil for UTF-8 (or ASCII, or
// none said), GBK or GB18030 for the Chinese national charsets. The charset
// parameter of the Content-Type header says it, else the form's charset
// field (Alipay's). Any other charset is an error: keyed on its raw bytes,
// a value would not be the one another reader decodes.
func formCharset(m *Message, form url.Values) (encoding.Encoding, error) {
	name := ""
	for _, h := range m.Headers {
		if strings.EqualFold(h.Key, "Content-Type") {
			if _, params, err := mime.ParseMediaType(string(h.Value)); err == nil {
				name = params["charset"]
			}
			break
		}
	}
	if name == "" {
		switch vs := form["charset"]; {
		case len(vs) > 1:
			return nil, fmt.Errorf("%w: form field \"charset\" appears %d times", ErrBadPayload, len(vs))
		case len(vs) == 1:
			name = vs[0]
		}
	}
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "utf-8", "utf8", "us-ascii", "ascii":
		return nil, nil
	case "gbk", "cp936", "x-gbk", "gb2312", "euc-cn":
		return simplifiedchinese.GBK, nil
	case "gb18030":
		return simplifiedchinese.GB18030, nil
	}
	return nil, fmt.Errorf("%w: form in charset %q: only UTF-8, GBK, GB2312 and GB18030 are read", ErrBadPayload, name)
}

// decodeForm decodes one key or value into UTF-8. Bytes that are not of
// the charset are refused, not replaced: two such values would be one.
func decodeForm(dec *encoding.Decoder, s string) (string, error) {
	out, err := dec.String(s)
	if err == nil && strings.ContainsRune(out, '\uFFFD') {
		err = fmt.Errorf("not valid in the charset")
	}
	if err != nil {
		return "", fmt.Errorf("%w: form value %q: %v", ErrBadPayload, s, err)
	}
	return out, nil
}
