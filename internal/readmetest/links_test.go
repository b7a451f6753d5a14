package readmetest

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	// codeSpan is an inline code span: links inside one are not links.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	// mdLink is an inline link, [text](target), without a title.
	mdLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	// scheme is a target that leaves the repository.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// link is one relative link of a page.
type link struct {
	line   int
	target string
}

// page is what the link check reads of a Markdown page.
type page struct {
	anchors map[string]bool // the headings' GitHub anchors
	links   []link          // relative links, outside code
}

// slug is the anchor GitHub gives a heading: lower case, letters, digits,
// '-' and '_' kept, spaces made '-', everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// readPage reads the headings and the relative links of the Markdown file
// at path, skipping fenced code blocks and code spans.
func readPage(path string) (page, error) {
	f, err := os.Open(path)
	if err != nil {
		return page{}, err
	}
	defer f.Close()
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	fenced := false
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h := strings.TrimLeft(line, "#"); h != line && strings.HasPrefix(h, " ") && len(line)-len(h) <= 6 {
			text := mdLink.ReplaceAllStringFunc(strings.TrimSpace(h), func(l string) string {
				return l[1:strings.Index(l, "](")]
			})
			s := slug(text)
			if k := seen[s]; k > 0 {
				p.anchors[fmt.Sprintf("%s-%d", s, k)] = true
			} else {
				p.anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			if !scheme.MatchString(m[1]) {
				p.links = append(p.links, link{line: n, target: m[1]})
			}
		}
	}
	return p, sc.Err()
}

// TestDocLinks checks the relative links of README.md, CHANGELOG.md and
// docs/*.md: each leads to a file or directory of the repository, and a
// #fragment to a heading of its page; and every page of docs/ is linked
// from README.md, so that each topic is reachable from its contents.
func TestDocLinks(t *testing.T) {
	root := moduleRoot(t)
	pages, err := docPages(root)
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "CHANGELOG.md")
	read := map[string]page{}
	load := func(file string) (page, error) {
		if p, ok := read[file]; ok {
			return p, nil
		}
		p, err := readPage(filepath.Join(root, filepath.FromSlash(file)))
		if err == nil {
			read[file] = p
		}
		return p, err
	}
	linkedFromReadme := map[string]bool{}
	for _, file := range pages {
		p, err := load(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range p.links {
			target, frag, _ := strings.Cut(l.target, "#")
			dest := file
			if target != "" {
				dest = path.Clean(path.Join(path.Dir(file), target))
			}
			where := fmt.Sprintf("%s:%d: link %s", file, l.line, l.target)
			if dest == ".." || strings.HasPrefix(dest, "../") {
				t.Errorf("%s: leads out of the repository", where)
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
				t.Errorf("%s: no such file: %s", where, dest)
				continue
			}
			if file == "README.md" {
				linkedFromReadme[dest] = true
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: an anchor in a file that is not Markdown", where)
				continue
			}
			dp, err := load(dest)
			if err != nil {
				t.Fatal(err)
			}
			if !dp.anchors[frag] {
				t.Errorf("%s: %s has no heading with the anchor #%s", where, dest, frag)
			}
		}
	}
	for _, file := range pages {
		if strings.HasPrefix(file, "docs/") && !linkedFromReadme[file] {
			t.Errorf("%s is not linked from README.md: add it to the contents", file)
		}
	}
}
